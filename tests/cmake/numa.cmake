# Issue 18: the host pool split over NUMA nodes: the partitioned pool (with its NUMA policy read
# back from the kernel).
tier_add_test(host_pool_parts_test LABEL unit
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/host_pool_parts_test.cc LIBS tier_storage)
