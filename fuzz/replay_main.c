/* replay_main.c - a main() for the fuzz targets in builds without
 * libFuzzer: runs LLVMFuzzerTestOneInput once on every file named on the
 * command line or found in the named folders (the seed corpus and any
 * crash reproducers kept there), so `make check` replays them with any
 * compiler. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "replay: cannot open %s\n", path);
    return 1;
  }
  static uint8_t data[1 << 20];
  size_t n = fread(data, 1, sizeof data, f);
  fclose(f);
  LLVMFuzzerTestOneInput(data, n);
  return 0;
}

int main(int argc, char **argv) {
  int files = 0, errors = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      fprintf(stderr, "replay: %s does not exist\n", argv[i]);
      errors++;
      continue;
    }
    if (!S_ISDIR(st.st_mode)) {
      errors += run_file(argv[i]);
      files++;
      continue;
    }
    DIR *d = opendir(argv[i]);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
      if (e->d_name[0] == '.')
        continue;
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
      errors += run_file(path);
      files++;
    }
    if (d)
      closedir(d);
  }
  printf("replayed %d inputs\n", files);
  return errors || files == 0;
}
