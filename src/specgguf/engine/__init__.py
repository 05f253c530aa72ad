"""Decoding rounds: one sequence (`decoder`) or several (`batch`), the draft policies that choose K, what they learn and store, the simulator that judges them, and the explicit calibration."""
