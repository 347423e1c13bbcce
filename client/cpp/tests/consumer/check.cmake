# cmake -DBUILD_DIR=... -DCONSUMER_DIR=... -DWORK_DIR=... -DVERSION=major.minor [-DCXX=...] -P check.cmake
#
# Installs the client from BUILD_DIR into WORK_DIR/prefix, then builds and
# runs the consumer with find_package(pg_idem VERSION) (the client's own
# major.minor: a 0.x release accepts requests for its own minor only) and
# with pkg-config.
function(run)
    execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
        message(FATAL_ERROR "failed (${rc}): ${ARGV}\n${out}\n${err}")
    endif()
    set(last_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

set(cxx_arg)
if(CXX)
    set(cxx_arg -DCMAKE_CXX_COMPILER=${CXX})
endif()
run(${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/cmake-build
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release -DPG_IDEM_VERSION=${VERSION} ${cxx_arg})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/cmake-build -j2)
foreach(exe consumer_shared consumer_static)
    run(${WORK_DIR}/cmake-build/${exe})
    message(STATUS "find_package ${exe}: ${last_output}")
endforeach()

file(GLOB_RECURSE pc_files ${prefix}/pg_idem.pc)
list(GET pc_files 0 pc_file)
get_filename_component(pc_dir ${pc_file} DIRECTORY)
file(MAKE_DIRECTORY ${WORK_DIR}/make)
set(make_cxx)
if(CXX)
    set(make_cxx CXX=${CXX})
endif()
run(${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${pc_dir}
    make -C ${WORK_DIR}/make -f ${CONSUMER_DIR}/Makefile SRC=${CONSUMER_DIR} ${make_cxx})
foreach(exe consumer_shared consumer_static)
    run(${WORK_DIR}/make/${exe})
    message(STATUS "pkg-config ${exe}: ${last_output}")
endforeach()
