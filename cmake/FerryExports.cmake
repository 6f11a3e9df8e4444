# FerryExports.cmake - the shared library exports exactly the functions that
# include/ferry.h declares: a linker version script generated from the
# header at configure time (CMake reruns when the header changes), so a new
# public function is exported by declaring it and nothing private leaks.
# cmake/check-exports.sh verifies the result independently (ctest).

# Writes a version script listing every ferry_* function declared in header.
function(ferry_write_version_script header out)
  file(READ ${header} text)
  string(REGEX REPLACE "/\\*([^*]|\\*+[^*/])*\\*+/" "" text "${text}") # comments
  string(REGEX REPLACE "#[^\n]*" "" text "${text}")                     # macros
  string(REGEX MATCHALL "ferry_[a-z0-9_]+[ \t\n]*\\(" calls "${text}")
  set(names "")
  foreach(c ${calls})
    string(REGEX REPLACE "[ \t\n]*\\($" "" name "${c}")
    list(APPEND names ${name})
  endforeach()
  list(REMOVE_DUPLICATES names)
  list(JOIN names ";\n    " body)
  set(script "{\n  global:\n    ${body};\n  local: *;\n};\n")
  # Rewritten only when it changes, so the library relinks only then.
  file(CONFIGURE OUTPUT ${out} CONTENT "${script}" @ONLY)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${header})
endfunction()
