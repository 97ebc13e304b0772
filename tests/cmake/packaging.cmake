# Issue 15: what an operator installs. A client and a daemon of different protocol versions refuse
# each other, naming both.
tier_add_test(protocol_version_test LABEL integration TIMEOUT 120
  SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/version_test.cc
  LIBS tier_test_daemon tier_client_static absl::strings)

# The Debian package, end to end as root: build it (the `package` target), dpkg -i, start tierd as
# the unit does, tierctl status, clients built against the installed headers and library
# (find_package(Tier), pkg-config, a wheel), dpkg --purge, nothing left (tests/package/deb_test.sh).
# Skips (77) unless root with dpkg. Not in sanitizer or fuzz builds: their binaries are not what a
# package ships.
if(NOT TIER_SANITIZE AND NOT TIER_FUZZ)
  add_test(NAME deb_package_test
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/package/deb_test.sh ${CMAKE_BINARY_DIR}
                   ${CMAKE_SOURCE_DIR} ${PROJECT_VERSION})
  set_tests_properties(deb_package_test PROPERTIES
    LABELS integration TIMEOUT 600 SKIP_RETURN_CODE 77)
endif()
