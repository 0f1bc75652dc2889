/* driver/hardware.c — hardware descriptions (models/hardware/NAME.json) for the time model
 * (passes/timing.h): `loom ir --time --hw h100`.
 *
 * A description is a small JSON file users can write:
 *   name               text
 *   sources, notes     where the figures come from (kept for the reader; not used)
 *   peak_tflops        dense peak per device by dtype: fp32 (required), tf32, bf16, fp16, fp8
 *   memory_gb          device memory (10^9 bytes)
 *   memory_tb_s        memory bandwidth (10^12 bytes/s)
 *   devices_per_node   devices that share the intra-node link
 *   intra_node, inter_node   {"gb_s": one direction per device (10^9 bytes/s), "latency_us": per ring step}
 *   efficiency         optional fractions of the peaks: matmul, attention, memory, link (default 1),
 *                      and per category of memory-bound op (passes/timing.h: norm, elementwise,
 *                      loss, optimizer, cast, reduce, copy; default: memory's)
 *   op_overhead_us     optional time added per op (kernel launch, dispatch; default 0)
 *   placement          optional axis order, innermost first (default ["tp","cp","ep","dp","pp"])
 * HW is a path to such a file, or a name looked up as $LOOM_HARDWARE_DIR/NAME.json, then in
 * the installed share/loom/models/hardware/ or the source tree's models/hardware/ (tools/share.c;
 * h100 = h100-sxm, a100 = a100-80gb).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frontend/config.h"
#include "driver/driver.h"


static const char *const known_keys[] = {"name", "sources", "notes", "peak_tflops", "memory_gb", "memory_tb_s",
                                         "devices_per_node", "intra_node", "inter_node", "efficiency",
                                         "op_overhead_us", "placement", NULL};

static int bad(char *err, size_t errlen, const char *path, const char *key, const char *what) {
  snprintf(err, errlen, "%s: %s: %s", path, key, what);
  return 2;
}

/* A positive number at obj[key] (required unless def >= 0, which it then defaults to). */
static int number(const char *path, const char *where, json_t *obj, const char *key, double def, double *out, char *err,
                  size_t errlen) {
  json_t *v = json_object_get(obj, key);
  char full[160];
  snprintf(full, sizeof full, "%s%s%s", where, *where ? "." : "", key);
  if (!v) {
    if (def >= 0) {
      *out = def;
      return 0;
    }
    return bad(err, errlen, path, full, "missing (a positive number)");
  }
  if (!json_is_number(v) || !(json_number_value(v) >= 0) || json_number_value(v) > 1e30) {
    char got[128];
    config_describe_value(v, got, sizeof got);
    char msg[256];
    snprintf(msg, sizeof msg, "expected a non-negative number, found %s", got);
    return bad(err, errlen, path, full, msg);
  }
  *out = json_number_value(v);
  return 0;
}

static int link_of(const char *path, json_t *root, const char *key, double *bw, double *lat, char *err, size_t errlen) {
  json_t *o = json_object_get(root, key);
  if (!json_is_object(o)) return bad(err, errlen, path, key, "expected {\"gb_s\": N, \"latency_us\": N}");
  double gb = 0, us = 0;
  int rc = number(path, key, o, "gb_s", -1, &gb, err, errlen);
  if (!rc) rc = number(path, key, o, "latency_us", 0, &us, err, errlen);
  if (rc) return rc;
  if (gb <= 0) return bad(err, errlen, path, key, "gb_s must be positive");
  *bw = gb * 1e9, *lat = us * 1e-6;
  return 0;
}

static int parse(const char *path, json_t *root, Hardware *hw, char *err, size_t errlen) {
  if (!json_is_object(root)) return bad(err, errlen, path, "(top level)", "expected a JSON object");
  const char *key;
  json_t *v;
  json_object_foreach(root, key, v) {
    int k = 0;
    while (known_keys[k] && strcmp(known_keys[k], key)) k++;
    if (!known_keys[k]) {
      const char *best = NULL;
      size_t bd = 4;
      for (k = 0; known_keys[k]; k++) {
        size_t d = config_edit_distance(key, known_keys[k]);
        if (d < bd) bd = d, best = known_keys[k];
      }
      char msg[256];
      snprintf(msg, sizeof msg, "unknown key%s%s%s", best ? " (did you mean '" : "", best ? best : "", best ? "'?)" : "");
      return bad(err, errlen, path, key, msg);
    }
  }
  memset(hw, 0, sizeof *hw);
  json_t *name = json_object_get(root, "name");
  snprintf(hw->name, sizeof hw->name, "%s", json_is_string(name) ? json_string_value(name) : path);
  json_t *pk = json_object_get(root, "peak_tflops");
  if (!json_is_object(pk)) return bad(err, errlen, path, "peak_tflops", "expected {\"fp32\": N, \"bf16\": N, ...}");
  static const struct { const char *key; DType dt; } dts[] = {
    {"fp32", DT_F32}, {"bf16", DT_BF16}, {"fp16", DT_F16}, {"fp8", DT_F8E4M3}, {"tf32", DT_COUNT}};
  json_object_foreach(pk, key, v) {
    int k = 0;
    while (k < 5 && strcmp(dts[k].key, key)) k++;
    if (k == 5) return bad(err, errlen, path, "peak_tflops", "keys are fp32, tf32, bf16, fp16, fp8");
    double x;
    int rc = number(path, "peak_tflops", pk, key, -1, &x, err, errlen);
    if (rc) return rc;
    if (dts[k].dt != DT_COUNT) hw->peak_flops[dts[k].dt] = x * 1e12;
    if (dts[k].dt == DT_F8E4M3) hw->peak_flops[DT_F8E5M2] = x * 1e12;
  }
  if (hw->peak_flops[DT_F32] <= 0) return bad(err, errlen, path, "peak_tflops.fp32", "missing or zero (every device has one)");
  double gb, tbs, dpn, us;
  int rc = number(path, "", root, "memory_gb", -1, &gb, err, errlen);
  if (!rc) rc = number(path, "", root, "memory_tb_s", -1, &tbs, err, errlen);
  if (!rc) rc = number(path, "", root, "devices_per_node", -1, &dpn, err, errlen);
  if (!rc) rc = number(path, "", root, "op_overhead_us", 0, &us, err, errlen);
  if (rc) return rc;
  if (gb <= 0 || tbs <= 0) return bad(err, errlen, path, "memory_gb, memory_tb_s", "must be positive");
  if (dpn < 1 || dpn != (double)(int64_t)dpn) return bad(err, errlen, path, "devices_per_node", "must be a whole number >= 1");
  hw->mem_bytes = gb * 1e9, hw->mem_bw = tbs * 1e12, hw->devices_per_node = (int64_t)dpn, hw->op_overhead = us * 1e-6;
  if ((rc = link_of(path, root, "intra_node", &hw->link_bw[LINK_INTRA], &hw->link_lat[LINK_INTRA], err, errlen)) ||
      (rc = link_of(path, root, "inter_node", &hw->link_bw[LINK_INTER], &hw->link_lat[LINK_INTER], err, errlen)))
    return rc;
  json_t *eff = json_object_get(root, "efficiency");
  json_t *empty = json_object();
  if (!eff) eff = empty;
  if (!json_is_object(eff)) rc = bad(err, errlen, path, "efficiency", "expected {\"matmul\": 0..1, ...}");
  if (!rc) rc = number(path, "efficiency", eff, "matmul", 1, &hw->eff_matmul, err, errlen);
  if (!rc) rc = number(path, "efficiency", eff, "attention", 1, &hw->eff_attention, err, errlen);
  if (!rc) rc = number(path, "efficiency", eff, "memory", 1, &hw->eff_memory, err, errlen);
  if (!rc) rc = number(path, "efficiency", eff, "link", 1, &hw->eff_link, err, errlen);
  for (int c = 0; !rc && c < TC_COUNT; c++)
    if (json_object_get(eff, timing_cat_names[c]))
      rc = number(path, "efficiency", eff, timing_cat_names[c], 0, &hw->eff_cat[c], err, errlen);
  const char *ekey;
  json_t *val;
  json_object_foreach(eff, ekey, val) {
    bool known = !strcmp(ekey, "matmul") || !strcmp(ekey, "attention") || !strcmp(ekey, "memory") || !strcmp(ekey, "link");
    for (int c = 0; c < TC_COUNT; c++) known |= !strcmp(ekey, timing_cat_names[c]);
    if (!rc && !known) {
      snprintf(err, errlen, "%s: efficiency: unknown key '%s'; the keys are matmul, attention, memory, link and the "
               "memory-bound categories norm, elementwise, loss, optimizer, cast, reduce, copy", path, ekey);
      rc = 2;
    }
  }
  json_decref(empty);
  if (rc) return rc;
  double e[4] = {hw->eff_matmul, hw->eff_attention, hw->eff_memory, hw->eff_link};
  for (int k = 0; k < 4; k++)
    if (e[k] <= 0 || e[k] > 1) return bad(err, errlen, path, "efficiency", "every efficiency is in (0, 1]");
  for (int c = 0; c < TC_COUNT; c++)
    if (json_object_get(eff, timing_cat_names[c]) && (hw->eff_cat[c] <= 0 || hw->eff_cat[c] > 1))
      return bad(err, errlen, path, "efficiency", "every efficiency is in (0, 1]");
  hardware_default_order(hw->axis_order);
  json_t *pl = json_object_get(root, "placement");
  if (pl) {
    bool seen[AX_COUNT] = {false};
    if (!json_is_array(pl) || json_array_size(pl) != AX_COUNT)
      return bad(err, errlen, path, "placement", "expected the five axes innermost first, e.g. [\"tp\",\"cp\",\"ep\",\"dp\",\"pp\"]");
    for (int k = 0; k < AX_COUNT; k++) {
      json_t *a = json_array_get(pl, (size_t)k);
      int ax = json_is_string(a) ? mesh_axis_parse(json_string_value(a)) : -1;
      if (ax < 0 || seen[ax]) return bad(err, errlen, path, "placement", "each of tp, cp, ep, dp, pp exactly once");
      seen[ax] = true;
      hw->axis_order[k] = ax;
    }
  }
  return 0;
}

int hardware_load(const char *hw_arg, Hardware *hw, char *err, size_t errlen) {
  char path[4096];
  const char *name = hw_arg;
  if (!strcmp(name, "h100")) name = "h100-sxm";
  if (!strcmp(name, "a100")) name = "a100-80gb";
  bool is_path = strchr(hw_arg, '/') || (strlen(hw_arg) > 5 && !strcmp(hw_arg + strlen(hw_arg) - 5, ".json"));
  if (is_path) {
    snprintf(path, sizeof path, "%s", hw_arg);
  } else {
    const char *dir = getenv("LOOM_HARDWARE_DIR");
    path[0] = 0;
    if (dir && *dir) {
      snprintf(path, sizeof path, "%s/%s.json", dir, name);
      if (access(path, R_OK)) path[0] = 0;
    }
    if (!path[0]) {   /* the installed share/loom/models/hardware/, else the source tree's (share.c) */
      char rel[300];
      snprintf(rel, sizeof rel, "models/hardware/%.200s.json", name);
      loom_share_path(rel, path, sizeof path);
    }
    if (access(path, R_OK)) {
      snprintf(err, errlen, "--hw %s: no hardware description of that name (shipped: h100 (h100-sxm), h200, a100 "
               "(a100-80gb), b200; or give a path to a JSON file: see models/hardware/ and docs/time-model.md)", hw_arg);
      return 2;
    }
  }
  json_t *root;
  int rc = config_read_json_file(path, &root, err, errlen);
  if (rc) return rc;
  rc = parse(path, root, hw, err, errlen);
  json_decref(root);
  return rc;
}
