/* tests/cuda_emu/emu_tail.h — appended by the fake NVRTC after loom's translation unit:
   the launch entries the fake driver calls.  Every loom kernel takes one LoomArgs by value;
   those marked LOOM_TMAP_KERNEL (emu.h) take their tensor maps (LoomTmaps) after it. */
static void loom_emu_call_loomargs(void *fn, void *arg) { ((void (*)(LoomArgs))fn)(*(const LoomArgs *)arg); }

extern "C" __attribute__((visibility("default"))) int loom_emu_launch(void *fn, void *arg, const unsigned grid[3],
                                                                       const unsigned block[3], unsigned smem, char *err,
                                                                       size_t errlen) {
  return loom_emu_launch_with(loom_emu_call_loomargs, fn, arg, grid, block, smem, err, errlen);
}

struct alignas(64) LoomEmuArgsMaps {
  LoomArgs a;
  LoomTmaps t;
};
static void loom_emu_call_tmaps(void *fn, void *arg) {
  const LoomEmuArgsMaps *p = (const LoomEmuArgsMaps *)arg;
  ((void (*)(LoomArgs, LoomTmaps))fn)(p->a, p->t);
}
extern "C" __attribute__((visibility("default"))) int loom_emu_launch_tmaps(void *fn, void *arg, const void *maps,
                                                                            const unsigned grid[3], const unsigned block[3],
                                                                            unsigned smem, char *err, size_t errlen) {
  LoomEmuArgsMaps p;
  memcpy(&p.a, arg, sizeof p.a);
  memcpy(&p.t, maps, sizeof p.t);
  return loom_emu_launch_with(loom_emu_call_tmaps, fn, &p, grid, block, smem, err, errlen);
}
