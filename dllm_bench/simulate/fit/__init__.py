"""`simulate --fit`: a hardware profile fitted to measured serve runs (docs/SIMULATE.md)."""
