import torch as th

# Tests run in parallel processes (pytest-xdist) on few cores: one torch thread each avoids oversubscription
th.set_num_threads(1)
