"""Oracles for tests and benchmarks, not used at run time: the numpy
reference of the verification ops (``reference``) and the offline simulator
that replays recorded traces through the real policy (``simulator``)."""
