/* library.h - shared libraries that serve one feature each, loaded when the
 * feature is first used.
 *
 * ferry links only what every engine needs (libc, libcrypto, jansson).
 * libfabric (the fabric transport), libcurl (the http and etcd metadata
 * stores), hiredis (the redis store) and the CUDA driver are opened by
 * soname at run time, so a host without one still loads ferry and keeps
 * every other feature; using the missing one fails with a message naming
 * the library, the feature and the package that provides it. */
#ifndef FERRY_BASE_LIBRARY_H
#define FERRY_BASE_LIBRARY_H

#include <stddef.h>

#include "ferry.h"

typedef struct ferry_library_symbol {
  const char *name;
  const char *version; /* the symbol version to bind (dlvsym), NULL: the default */
  size_t offset;       /* of its function pointer in the library's table */
} ferry_library_symbol;

/* One library: what it is for, and the table of function pointers that a
 * successful load fills. Defined once, statically, by its only user. */
typedef struct ferry_library {
  const char *soname;  /* "libhiredis.so.0.14" */
  const char *package; /* the Debian package that installs it, NULL: none to name */
  const char *feature; /* "the redis metadata store" */
  const ferry_library_symbol *symbols;
  size_t nsymbols;
  void *table; /* all NULL unless loaded */
  size_t table_size;
  int attempted, loaded; /* under library.c's lock */
  char missing[384];     /* why not, when not loaded */
} ferry_library;

#define FERRY_LIBRARY_SYMBOL(table_type, field, name, version)                                     \
  { name, version, offsetof(table_type, field) }

#define FERRY_LIBRARY(soname, package, feature, symbols, table)                                    \
  {                                                                                                \
    soname, package, feature, symbols, sizeof symbols / sizeof *symbols, &table, sizeof table, 0,  \
        0, ""                                                                                      \
  }

/* Loads lib once per process (it stays loaded). FERRY_OK when every symbol
 * is in its table; otherwise FERRY_ENOTIMPL, with the detail "<feature>:
 * not available without <soname>, which cannot be loaded on this host
 * (<why>). Fix: apt-get install <package>". */
ferry_status ferry_library_load(ferry_library *lib);

#endif
