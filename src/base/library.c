/* library.c - opening a feature's library at its first use (see library.h). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/library.h"

/* One lock for every library: loads are rare (once each), and a
 * concurrent first use must wait for the load, not race it. */
static pthread_mutex_t loading_lock = PTHREAD_MUTEX_INITIALIZER;

/* Words the Python drop-in looks for (mooncake/engine.py). */
#define CANNOT_LOAD "which cannot be loaded on this host"

static void *lookup(void *handle, const ferry_library_symbol *s) {
  return s->version ? dlvsym(handle, s->name, s->version) : dlsym(handle, s->name);
}

static void load(ferry_library *lib) {
  void *handle = dlopen(lib->soname, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    snprintf(lib->missing, sizeof lib->missing, "dlopen: %s", dlerror());
    return;
  }
  for (size_t i = 0; i < lib->nsymbols; i++) {
    const ferry_library_symbol *s = &lib->symbols[i];
    void *fn = lookup(handle, s);
    if (!fn) {
      snprintf(lib->missing, sizeof lib->missing, "it has no %s%s%s: another version", s->name,
               s->version ? "@" : "", s->version ? s->version : "");
      memset(lib->table, 0, lib->table_size); /* no pointer into a closed library */
      dlclose(handle);
      return;
    }
    memcpy((char *)lib->table + s->offset, &fn, sizeof fn);
  }
  lib->loaded = 1;
}

ferry_status ferry_library_load(ferry_library *lib) {
  pthread_mutex_lock(&loading_lock);
  if (!lib->attempted)
    load(lib);
  lib->attempted = 1;
  int loaded = lib->loaded;
  pthread_mutex_unlock(&loading_lock);
  if (loaded)
    return FERRY_OK;
  if (!lib->package)
    return ferry_fail(FERRY_ENOTIMPL, "%s: not available without %s, " CANNOT_LOAD " (%s)",
                      lib->feature, lib->soname, lib->missing);
  return ferry_fail(FERRY_ENOTIMPL,
                    "%s: not available without %s, " CANNOT_LOAD " (%s). Fix: apt-get install %s",
                    lib->feature, lib->soname, lib->missing, lib->package);
}
