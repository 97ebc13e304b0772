# Issue 18: the host pool split over NUMA nodes. Topology from a fake sysfs tree, the layout
# rules, the partitioned pool (with its NUMA policy read back from the kernel), admission into
# the parts, and a real tierd with two parts.
tier_add_test(numa_topology_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/numa_topology_test.cc
          ${CMAKE_SOURCE_DIR}/tests/unit/pool_layout_test.cc
  LIBS tierd_lib)
tier_add_test(host_pool_parts_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/host_pool_parts_test.cc LIBS tier_storage)
tier_add_test(tier_manager_parts_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/tier_manager_parts_test.cc LIBS tierd_lib)
tier_add_test(pool_parts_test LABEL integration TIMEOUT 300
  SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/pool_parts_test.cc
  LIBS tier_test_daemon tier_client_static)
