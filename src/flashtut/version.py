"""The package's version, in its own module so that provenance records can read it without
importing the public facade (``flashtut.__init__``) from below it."""
__version__ = "0.1.0"
