# Issue 18: the host pool split over NUMA nodes. Topology from a fake sysfs tree, the layout
# rules, and the partitioned pool (with its NUMA policy read back from the kernel).
tier_add_test(numa_topology_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/numa_topology_test.cc
          ${CMAKE_SOURCE_DIR}/tests/unit/pool_layout_test.cc
  LIBS tierd_lib)
tier_add_test(host_pool_parts_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/host_pool_parts_test.cc LIBS tier_storage)
