"""Cost models: formulas for what attention costs, with no measuring and no I/O.

* :mod:`~flashtut.costs.flops`: the FLOPs credited to one attention call (the protocol's count);
* :mod:`~flashtut.costs.memory`: tensor sizes, naive attention's peak memory, per-kernel HBM traffic;
* :mod:`~flashtut.costs.io_complexity`: the HBM transfers of the standard, FlashAttention-1 and
  FlashAttention-2 loop schedules, counted transfer by transfer;
* :mod:`~flashtut.costs.decode_traffic`: the bytes one decoding step must move over a KV cache.

The measurements that check these models live in :mod:`flashtut.bench`.
"""
