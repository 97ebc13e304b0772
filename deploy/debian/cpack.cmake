# The Debian package: `cmake --build build --target package` writes build/tierd_<version>_<arch>.deb
# with tierd and tierctl (/usr/bin), libtierclient (/usr/lib) with its headers (/usr/include/tier),
# pkg-config file and CMake package (find_package(Tier)), the systemd unit, the default config
# (/etc/tierd/tierd.conf, a conffile) and the sysusers.d entry; the maintainer scripts beside this
# file create the user and group, and purge removes /var/lib/tierd. One package, not a
# daemon/library/-dev split: a node that trains also runs the daemon. The package's dependencies
# are the shared libraries the binaries link (dpkg-shlibdeps, from dpkg-dev). Included by the top
# CMakeLists.txt; tests/package/deb_test.sh builds, installs, uses and purges it.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME tierd)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "Tierd maintainers <maintainers@tierd.invalid>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "per-node GPU memory-tiering daemon, its CLI and client library")
# The synopsis is the summary above; this is the extended description (CPack indents it).
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION [=[
tierd owns the node's pinned host memory and NVMe spill space; training processes link
libtierclient and hand it the tensors they want out of GPU memory. The daemon does the copies on
its own streams, ordered against the trainer's streams.

This package holds tierd (systemd unit tierd.service, config /etc/tierd/tierd.conf), tierctl, and
libtierclient with its headers, pkg-config file (tierclient) and CMake package (Tier).]=])
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
  ${CMAKE_CURRENT_LIST_DIR}/postinst ${CMAKE_CURRENT_LIST_DIR}/prerm
  ${CMAKE_CURRENT_LIST_DIR}/postrm ${CMAKE_CURRENT_LIST_DIR}/conffiles
  ${CMAKE_CURRENT_LIST_DIR}/triggers)
# Release binaries: no debug sections in the package.
set(CPACK_STRIP_FILES ON)
# These install components, in one package (not the Python package, which `pip wheel ./python`
# builds, nor tier_demo).
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_GROUPING ALL_COMPONENTS_IN_ONE)
set(CPACK_COMPONENTS_ALL daemon client dev system)
include(CPack)
