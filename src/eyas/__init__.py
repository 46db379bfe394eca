"""eyas: EAGLE-3 drafters trained from a target LLM's hidden states."""

import os

# OpenMP threads that wait for work sleep instead of spinning. Set before torch loads its OpenMP
# runtime (which reads it once); a user's own setting wins. On a 2-core machine shared with other jobs,
# spinning threads starve the thread a parallel region waits for: 4 real CPU train steps took 57 s
# with 2 spinning threads, 24 s with 2 passive ones and 28 s with 1 thread (load average ~3.7).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
