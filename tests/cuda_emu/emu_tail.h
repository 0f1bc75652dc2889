/* tests/cuda_emu/emu_tail.h — appended by the fake NVRTC after loom's translation unit:
   the launch entry the fake driver calls.  Every loom kernel takes one LoomArgs by value. */
static void loom_emu_call_loomargs(void *fn, void *arg) { ((void (*)(LoomArgs))fn)(*(const LoomArgs *)arg); }

extern "C" __attribute__((visibility("default"))) int loom_emu_launch(void *fn, void *arg, const unsigned grid[3],
                                                                       const unsigned block[3], unsigned smem, char *err,
                                                                       size_t errlen) {
  return loom_emu_launch_with(loom_emu_call_loomargs, fn, arg, grid, block, smem, err, errlen);
}
