# Layer, state cache and step plan tests (src/layer*.c, src/cache.c, src/plan.c): the cache's
# slot operations and the plan's metadata on one process; the plan's broadcast, error
# propagation and cross-rank consistency check under mpirun; the tensor-parallel layer at
# TP = 1, 2 and 4 (all-reduce and sequence parallel) against a TP = 1 run on every rank.
gdp_add_test(test_cache LABEL cpu TIMEOUT 60)
gdp_add_test(test_plan LABEL cpu TIMEOUT 60)
gdp_add_test(test_plan_mpi_np2 SOURCES test_plan.c LABEL mpi NPROCS 2 TIMEOUT 60 ARGS --mpi)
gdp_add_test(test_plan_mpi_np4 SOURCES test_plan.c LABEL mpi NPROCS 4 TIMEOUT 60 ARGS --mpi)
gdp_add_test(test_layer_shared LABEL cpu TIMEOUT 60)
gdp_add_test(test_layer_tp_np1 SOURCES test_layer_tp.c layer_harness.c LABEL mpi NPROCS 1 TIMEOUT 120)
gdp_add_test(test_layer_tp_np2 SOURCES test_layer_tp.c layer_harness.c LABEL mpi NPROCS 2 TIMEOUT 120)
gdp_add_test(test_layer_tp_np4 SOURCES test_layer_tp.c layer_harness.c LABEL mpi NPROCS 4 TIMEOUT 180)
gdp_add_test(test_layer_tp_sp_np2 SOURCES test_layer_tp.c layer_harness.c LABEL mpi NPROCS 2 TIMEOUT 120 ARGS --sp)
gdp_add_test(test_layer_tp_sp_np4 SOURCES test_layer_tp.c layer_harness.c LABEL mpi NPROCS 4 TIMEOUT 180 ARGS --sp)
