# Install rules, pkg-config file and the CMake package (find_package(collie)).
include(CMakePackageConfigHelpers)

install(TARGETS collie collie_static EXPORT collieTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES include/nccl.h include/collie.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS collie-run collie-rendezvous collie-info RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(CODE "execute_process(COMMAND ${CMAKE_COMMAND} -E create_symlink libcollie.so.${PROJECT_VERSION_MAJOR}
  \$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/libnccl.so.2)")
install(FILES docs/ENV.md docs/ARCHITECTURE.md DESTINATION ${CMAKE_INSTALL_DOCDIR} OPTIONAL)

# Targets of other packages the static library needs.
set(COLLIE_CONFIG_DEPS "find_dependency(Threads)")
if(COLLIE_HAVE_HWLOC)
  string(APPEND COLLIE_CONFIG_DEPS "\nfind_dependency(PkgConfig)\npkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc)")
endif()
if(COLLIE_HAVE_CUDA)
  string(APPEND COLLIE_CONFIG_DEPS "\nfind_dependency(CUDAToolkit)")
endif()

install(EXPORT collieTargets NAMESPACE collie:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/collie)
configure_package_config_file(cmake/collieConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/collieConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/collie)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/collieConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/collieConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/collieConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/collie)

set(COLLIE_PC_REQUIRES_PRIVATE "")
if(COLLIE_HAVE_HWLOC)
  set(COLLIE_PC_REQUIRES_PRIVATE "hwloc")
endif()
# Relocatable: the prefix is found relative to the .pc file itself.
file(RELATIVE_PATH COLLIE_PC_UP "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
configure_file(cmake/collie.pc.in ${CMAKE_CURRENT_BINARY_DIR}/collie.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/collie.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
