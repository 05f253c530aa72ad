"""The arithmetic of one round: verification ops (C++ `_core`), warping and the sampler's rules, the drafter interface and the n-gram drafter. No llama.cpp here."""
