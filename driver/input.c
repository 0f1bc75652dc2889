/* driver/input.c — a model from a spec (built by the frontend) or an .ir file (parsed). */
#include <string.h>

#include "driver/driver.h"

int input_load(const char *path, const char *const *overrides, int n_overrides, Input *in, char *err, size_t errlen) {
  memset(in, 0, sizeof *in);
  if (ends_with(path, ".ir")) {
    if (n_overrides) {
      snprintf(err, errlen, "%s: --%.*s applies to model specs, not to IR files (their shapes are fixed in the text)",
               path, (int)strcspn(overrides[0], "="), overrides[0]);
      return EXIT_USAGE;
    }
    int rc = parse_module_file(path, &in->m, err, errlen);
    /* Passes assume verified IR: check a file before any pass sees it. */
    if (!rc && (rc = verify_module(in->m, err, errlen))) {
      module_free(in->m);
      in->m = NULL;
    }
    return rc;
  }
  int rc = spec_load(path, &in->spec, err, errlen);
  if (rc) return rc;
  for (int i = 0; i < n_overrides; i++) {
    char key[64], flag[80];
    size_t k = strcspn(overrides[i], "=");
    snprintf(key, sizeof key, "%.*s", (int)(k < 63 ? k : 63), overrides[i]);
    snprintf(flag, sizeof flag, "--%s", key);
    rc = spec_set(&in->spec, key, overrides[i] + k + 1, flag, err, errlen);
    if (rc) return rc;
  }
  rc = spec_validate(&in->spec, err, errlen);
  if (rc) return rc;
  char name[256];
  frontend_module_name(path, name, sizeof name);
  in->from_spec = true;
  return frontend_build(&in->spec, name, &in->m, err, errlen);
}
