// fwd_w4_persistent.cu: Hopper rung W4, W3 with persistent blocks (sm_90a), kernel flash_fwd_w4.
//
// W3 launches one block per query block: 2816 blocks at B = 4, H = 32, N = 4096 and 192-row blocks,
// about 21 waves of 132 on an H200, one block per SM at a time (its registers fill the SM). Each block
// starts cold: its producer loads Q and the first K and V tiles while its consumers wait, and its
// consumers' last softmax, P V and store run while the producer has nothing left to load. Causal
// blocks are short (a block sees on average half the keys), so that start and end are a larger share.
//
// W4 keeps W3's warpgroups, ring and schedule per query block and changes who runs which block: the grid
// has at most one block per SM, and block b walks the query blocks t = b, b + gridDim.x, ... of all
// B * H heads. The producer runs ahead across query blocks: it loads the next block's Q as soon as every
// consumer warp has issued its last Q K^T of the current one (a q_empty mbarrier, the one new barrier),
// and its K/V tiles into the ring as stages free up, while the consumers finish. The ring's stage and
// phase count on across query blocks (tile g of the block's whole K/V stream sits in stage g % S), and
// the turns continue in the same order (the last consumer gives consumer 0 the first turn of every query
// block, and none after its last slot): ping-pong with two consumers, the ring with three and W3_C3_TURNS.
//
// Block b takes query block number t = b first, then the next number of a global counter (the producer
// takes it one query block ahead and hands it to the consumers through shared memory). Numbers map to
// query blocks in a fixed order (section_query_block): causal, the heaviest (last) query block of every
// head of a section of 8 heads first, then the next heaviest, so that the last blocks to start are the
// shortest; otherwise a head's blocks in a row, so that the blocks running at once share K and V in L2.
// flashtut.cuda.models.hopper_schedule.simulate_persistent plays the barrier protocol for sequences of query
// blocks on the CPU.
#define W3_PERSISTENT 1
#include "fwd_w3_pingpong.cu"
