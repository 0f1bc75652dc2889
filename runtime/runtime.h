/* runtime/runtime.h — the index of runtime/: what runs a lowered program.  No file under
 * runtime/ (but runtime/exec/, below) includes an IR or compiler header: a compiled executable
 * runs the bytes of an RtProgram and nothing else.  This header only lists the files; include
 * the one you need.
 *
 *   fail.h/.c        rt_fail: the one error helper (a message into err, the code returned)
 *   program.h/.c     the lowered program (RtProgram: functions of steps, globals, placements),
 *                    as bytes and back (rt_program_save/load), its builtins' table
 *   builtins.def     every runtime builtin, defined once (name, buffers, the IR op it runs)
 *   trainer.h/.c     the training loop over an Executor: data, learning-rate schedule,
 *                    accumulation, validation, logging, checkpoints, exact resume
 *   device.h/.c      RtDevice, one rank's device (call a function, read or write a global;
 *                    cpu_exec.c and cuda_exec.c implement it), and the one rank executor
 *                    over it (RtRankExec: grad, optimizer and validation steps, the views)
 *
 *   cpu/             the CPU backend
 *     cpu_exec.h/.c    a program run step by step: arena, JIT'd kernels, GEMMs, builtins
 *     cpu_builtin.c    one builtin step: checks, unpacking, dispatch to the kernels
 *     cpu_kernels.c    norms, softmax, losses, AdamW, elementwise builtins (cpu_kernels.h)
 *     cpu_attention.c, cpu_attention_tiles.h, cpu_attn_block.c  attention, RoPE, ring blocks
 *     cpu_data.c       embedding and data movement;  cpu_moe.c  mixture of experts
 *     cpu_decode.c     generation with a KV cache (rope_at, attention_cached, kv_write)
 *     cpu_mesh.c       the rank-dependent builtins: collectives, send/recv
 *     cpu_async.c      async collectives on a rank's communication thread
 *     cpu_gemm.c       GEMMs through OpenBLAS;  jit.c  LLVM ORC JIT;  threadpool.c
 *   cuda/            the CUDA backend (libcuda, NVRTC, cuBLASLt and NCCL loaded at run time)
 *     cuda_api.c       the driver API through dlopen;  nvrtc.c  NVRTC and the kernel cache
 *     cuda_exec.c      a program on one GPU: its init and free, the program as an RtDevice
 *     cuda_check.c     what needs no device: conversions, the program's checks, the memory plan
 *     cuda_memory.c    device memory from the host: allocations, copies of globals and buffers
 *     cuda_call.c      a call of a function: its steps or its CUDA graph, the profile
 *     cuda_step.c      a training step as one CUDA graph, issued before the last one is read
 *     cuda_gemm.c      its GEMM steps: cuBLASLt plans, epilogues, the algorithms' timing
 *     cuda_mesh.c      a program as one rank of a mesh: collective steps over NCCL
 *   comm/            ranks talking
 *     comm.h           the Comm interface (collectives and point-to-point per mesh axis)
 *     comm_local.c     ranks as threads of one process;  comm_engine.c  a communication thread
 *     comm_nccl.c      ranks as processes over NCCL;  nccl_bootstrap.c  their rendezvous
 *     launch.c, spawn.c  the launch environment, one supervised process per rank
 *   io/              files
 *     safetensors.c    safetensors read/write, atomic files;  tokens.c, textdata.c, data.c
 *                      token shards and the data loader;  tokenizer.c  byte-level BPE
 *     checkpoint.c     atomic checkpoints;  checkpoint_shards.c  one shard per rank;
 *     checkpoint_files.c  their file helpers and expert names
 *   exec/            the execution layer (runtime/exec/exec.h, library loom_exec): executors,
 *                    the pipeline walker, the training entry point, weights and HF export.  It
 *                    also reads the IR module (the reference interpreter, and the mesh
 *                    executors' bookkeeping of whole and per-rank tensors): see
 *                    docs/architecture.md for what is left to make it IR-free.
 */
#ifndef LOOM_RUNTIME_RUNTIME_H
#define LOOM_RUNTIME_RUNTIME_H
#endif
