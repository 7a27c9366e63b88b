// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
/*
 * nccl-tide public C API.
 *
 * Zero-copy, SM-free all-gather (TIDE-AG) and reduce-scatter (TIDE-RS) for FSDP-style
 * training, on top of NCCL. This header is the only public interface of libnccl-tide.so.
 *
 * Conventions for every function here:
 *   - Returns tideResult_t; tideSuccess (0) on success. On failure a one-line reason is
 *     available from tideGetLastError() (thread-local, valid until the next failing call
 *     on the same thread). No C++ exception ever crosses this interface.
 *   - Bad input is detected before any data is written: a failing call leaves every
 *     output buffer untouched.
 *   - Structs passed in start with `size` (set it to sizeof(the struct)) and `version`
 *     (set it to the matching TIDE_*_VERSION macro); structs only ever grow.
 *   - Handles are opaque; the caller owns what it creates and releases it with the
 *     matching Destroy function. Destroy(NULL) is a no-op returning tideSuccess; every
 *     handle argument is checked (see "Handles" below): a destroyed, twice-destroyed,
 *     garbage or wrong-type handle gives tideInvalidArgument naming it.
 *   - "(since 0.1)" gives the library version in which a function appeared.
 *
 * Layout semantics (one FSDP parameter group; FSDP2 dim-0 sharding):
 *   W = worldSize, R = ranksPerNode, N = W / R nodes, rank r = node (r / R), local rank (r % R).
 *   For parameter i with numel n_i and rowNumel c_i (elements per dim-0 row; 1 for flat):
 *     rows_i            = n_i / c_i
 *     shardNumel_i      = ceil(rows_i / W) * c_i          (padding at the end of dim 0)
 *     unsharded storage = shardNumel_i * W elements; the parameter is its prefix [0, n_i)
 *   Rank r's shard of parameter i is elements [r * shardNumel_i, (r+1) * shardNumel_i) of the
 *   padded unsharded tensor (elements >= n_i are padding).
 *   Packed send buffer (what FSDP2 calls all_gather_input): param-major, parameter i at
 *     sendOffset_i bytes, shardNumel_i elements; offsets are the running sum of shard bytes,
 *     each aligned up to the parameter's element size.
 *   Slot (unsharded storage of the whole group): param-major, parameter i at slotOffset_i
 *     bytes, shardNumel_i * W elements; each offset aligned up to TIDE_SLOT_ALIGN bytes.
 *   RS packed output: param-major, parameter i at rsOutOffset_i *elements* (of the output
 *     dtype), shardNumel_i elements, no gaps (FSDP2's flat reduce-scatter output layout).
 *
 * AG result: on every rank, for every parameter i and every source rank s,
 *   param_i[s * shardNumel_i + k] = shard_i(rank s)[k] for k < shardNumel_i (byte copy).
 *
 * RS result and accumulation order (the contract every executor meets bit for bit):
 *   For output rank r, parameter i, element k < shardNumel_i, let j = r * shardNumel_i + k and
 *   x_s = (float) grad_i(rank s)[j] if j < n_i else 0.0f (exact conversion to fp32).
 *   With op PREMUL_SUM, x_s = x_s * scale (fp32 multiply, round to nearest, no FMA).
 *   partial(node m) = (((x_{mR} + x_{mR+1}) + x_{mR+2}) + ... + x_{mR+R-1})   fp32, left to right
 *   total          = ((partial(0) + partial(1)) + ... + partial(N-1))        fp32, left to right
 *   With op AVG, total = total / (float) W (fp32 IEEE division).
 *   out = total (fp32) or total rounded to nearest-even in bf16/fp16.
 *   All fp32 operations are individually rounded (no contraction into FMA).
 *   NaN results: an output element that is NaN is written as the canonical quiet NaN of the output type,
 *   TIDE_CANONICAL_NAN_F32 / _BF16 / _FP16 below (positive, quiet bit only), whatever the inputs' NaN signs and
 *   payloads: IEEE leaves the NaN an operation returns to the hardware, so this is what makes every executor (host,
 *   vectorised or not, CUDA kernel) and the Python reference agree bit for bit on NaN too. The all-gather is a byte
 *   copy: it keeps every bit, NaN payloads included.
 *
 * Buffer alignment: every element pointer (shards, params, grads, outs, sendbuff, slot regions) must be aligned to
 * its element size (2 bytes for bf16/fp16, 4 for fp32/int32); a misaligned one is refused with
 * tideInvalidArgument before anything is written (host executor and CUDA data path alike).
 *
 * Handles: tideLayout_t and tideComm_t values are checked on every call. A NULL, destroyed (also a second
 * destroy), garbage or wrong-type handle is refused with tideInvalidArgument naming the handle and why; values are
 * never reused within a process. Destroying a handle while another thread is inside a call that uses it is safe:
 * that call completes (a layout), or completes / fails with tideInvalidArgument (a comm: tideCommDestroy waits for
 * a call in progress on the comm and a call that has not started yet fails); the object is freed when the last
 * such call returns.
 */
#ifndef NCCL_TIDE_H_
#define NCCL_TIDE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TIDE_VERSION_MAJOR 0
#define TIDE_VERSION_MINOR 1
#define TIDE_VERSION_PATCH 0
/* Encoded as major * 10000 + minor * 100 + patch. */
#define TIDE_VERSION_CODE (TIDE_VERSION_MAJOR * 10000 + TIDE_VERSION_MINOR * 100 + TIDE_VERSION_PATCH)

/* Alignment of every parameter's offset inside a slot, in bytes. */
#define TIDE_SLOT_ALIGN 256

/* The NaN every reduce-scatter executor writes for a NaN result (see "NaN results" above). (since 0.1) */
#define TIDE_CANONICAL_NAN_F32 0x7fc00000u
#define TIDE_CANONICAL_NAN_BF16 0x7fc0u
#define TIDE_CANONICAL_NAN_FP16 0x7e00u

/* Hard limits that keep every derived size far from 64-bit overflow. */
#define TIDE_MAX_PARAMS (1 << 20)
#define TIDE_MAX_WORLD_SIZE 65536
#define TIDE_MAX_RANKS_PER_NODE 64
#define TIDE_MAX_PARAM_NUMEL (1ULL << 40)

/* ------------------------------------------------------------------------------------ */
/* Results and errors                                                                    */
/* ------------------------------------------------------------------------------------ */

typedef enum {
  tideSuccess = 0,
  tideInvalidArgument = 1, /* a NULL, out-of-range, misaligned or inconsistent argument */
  tideInvalidUsage = 2,    /* a call that is not allowed in the current state */
  tideUnsupported = 3,     /* valid, but this build or runtime cannot do it (no CUDA, old NCCL, ...) */
  tideOutOfMemory = 4,     /* host or device allocation failed; nothing was leaked */
  tideCudaError = 5,       /* a CUDA runtime/driver call failed; see tideGetLastError() */
  tideNcclError = 6,       /* an NCCL call failed */
  tideSystemError = 7,     /* an OS call failed (dlopen, ...) */
  tideMismatch = 8,        /* ranks disagree (layout or config hash) */
  tideTimeout = 9,         /* a bounded wait expired */
  tideInternalError = 10,  /* a bug in TIDE; please report it */
  tideNumResults = 11
} tideResult_t;

/* Static, never-NULL name of a result code, e.g. "tideInvalidArgument: invalid argument".
 * (since 0.1) */
const char* tideGetErrorString(tideResult_t result);

/* Message of the last failing call on this thread ("" if none). The pointer stays valid
 * until the next TIDE call on this thread. (since 0.1) */
const char* tideGetLastError(void);

/* Writes TIDE_VERSION_CODE of the loaded library to *version. Errors: tideInvalidArgument
 * if version is NULL. (since 0.1) */
tideResult_t tideGetVersion(int* version);

/* ------------------------------------------------------------------------------------ */
/* Data types and reduction ops                                                          */
/* ------------------------------------------------------------------------------------ */

typedef enum {
  tideBfloat16 = 0,
  tideFloat16 = 1,
  tideFloat32 = 2,
  tideFloat8e4m3 = 3,
  tideFloat8e5m2 = 4,
  tideInt8 = 5,
  tideInt32 = 6,
  tideNumDataTypes = 7
} tideDataType_t;

typedef enum {
  tideSum = 0,        /* plain sum */
  tideAvg = 1,        /* sum divided by world size (see the order above) */
  tidePremulSum = 2,  /* sum of (input * scale), scale an fp32 host value */
  tideNumRedOps = 3
} tideRedOp_t;

/* Size in bytes of one element of dtype into *bytes. Errors: tideInvalidArgument for an
 * unknown dtype or NULL bytes. (since 0.1) */
tideResult_t tideDataTypeSize(tideDataType_t dtype, size_t* bytes);

/* ------------------------------------------------------------------------------------ */
/* Configuration                                                                         */
/* ------------------------------------------------------------------------------------ */

#define TIDE_CONFIG_VERSION 1

/* Knobs that change plans. A zero field means "use the NCCL_TIDE_* parameter's value"
 * (docs/env.md). Every field is part of the layout hash: it must match on all ranks. */
typedef struct {
  size_t size;            /* sizeof(tideConfig_t) */
  unsigned int version;   /* TIDE_CONFIG_VERSION */
  uint64_t rsChunkBytes;  /* RS pipeline chunk, bytes of this rank's fp32 output (NCCL_TIDE_RS_CHUNK_BYTES) */
  uint64_t paceBytes;     /* inter-node cap on bytes in flight per schedule step (NCCL_TIDE_PACE_BYTES) */
} tideConfig_t;
/* A config field accepts any value >= 1 (0 = the environment's), down to single bytes, so that tests and tuning
 * can force many chunks or schedule steps on small layouts; the environment variables accept 4 KiB .. 1 TiB, the
 * range that makes sense in production. */

/* ------------------------------------------------------------------------------------ */
/* Layouts and plans (host only; no GPU or NCCL needed)                                  */
/* ------------------------------------------------------------------------------------ */

typedef struct tideLayout* tideLayout_t;

#define TIDE_LAYOUT_DESC_VERSION 1

typedef struct {
  size_t size;                   /* sizeof(tideLayoutDesc_t) */
  unsigned int version;          /* TIDE_LAYOUT_DESC_VERSION */
  int nParams;                   /* 1 .. TIDE_MAX_PARAMS */
  const uint64_t* numels;        /* [nParams], each 1 .. TIDE_MAX_PARAM_NUMEL */
  const uint64_t* rowNumels;     /* [nParams] elements per dim-0 row (divides numel), or NULL for all 1 */
  const tideDataType_t* dtypes;  /* [nParams] */
  int worldSize;                 /* 1 .. TIDE_MAX_WORLD_SIZE */
  int ranksPerNode;              /* 1 .. min(worldSize, TIDE_MAX_RANKS_PER_NODE), divides worldSize */
  int rank;                      /* 0 .. worldSize-1: the calling rank (not part of the hash) */
} tideLayoutDesc_t;

/* Creates an immutable layout and all its plans. The desc's arrays are copied; the caller
 * keeps ownership of them. config may be NULL (all defaults).
 * Errors: tideInvalidArgument (NULL pointers, bad struct size/version, zero or too large
 * counts, rowNumel not dividing numel, unknown dtype, world/rank/ranksPerNode out of range,
 * ranksPerNode not dividing worldSize, derived sizes that would overflow), tideOutOfMemory.
 * On failure *layout is set to NULL. (since 0.1) */
tideResult_t tideLayoutCreate(const tideLayoutDesc_t* desc, const tideConfig_t* config, tideLayout_t* layout);

/* Releases a layout. Safe on NULL. A call using the layout on another thread (or an attachment, tideAttachLayout)
 * keeps the object until it returns; the handle itself is invalid at once. Errors: tideInvalidArgument (a handle that
 * is not live: already destroyed, garbage, or a tideComm_t). (since 0.1) */
tideResult_t tideLayoutDestroy(tideLayout_t layout);

#define TIDE_LAYOUT_INFO_VERSION 1

typedef struct {
  size_t size;              /* caller sets sizeof(tideLayoutInfo_t) */
  unsigned int version;     /* caller sets TIDE_LAYOUT_INFO_VERSION */
  int nParams;
  int worldSize;
  int ranksPerNode;
  int nNodes;
  int rank;
  uint64_t hash;            /* stable 64-bit hash of everything that must match across ranks */
  uint64_t sendBytes;       /* packed send buffer (this rank's shards) */
  uint64_t slotBytes;       /* unsharded storage of the whole group: slotOffset + shardNumel * W * elemSize of
                               the last parameter (no trailing padding) */
  uint64_t rsOutNumel;      /* elements of one rank's packed RS output (sum of shardNumel_i) */
  uint64_t rsChunkNumel;    /* RS pipeline chunk, in output elements */
  int rsNumChunks;          /* ceil(rsOutNumel / rsChunkNumel) */
  uint64_t rsStagingBytes;  /* per-rank RS staging (depends on ranksPerNode and chunk, never on worldSize) */
  int slotReuseFits;        /* 1 if rsStagingBytes <= slotBytes: staging may live in the vacated AG slot */
  uint64_t paceBytes;       /* effective inter-node pacing cap */
} tideLayoutInfo_t;

/* Fills *info. Errors: tideInvalidArgument (NULL, bad size/version, a layout handle that is not live). (since 0.1) */
tideResult_t tideLayoutGetInfo(tideLayout_t layout, tideLayoutInfo_t* info);

#define TIDE_PARAM_INFO_VERSION 1

typedef struct {
  size_t size;              /* caller sets sizeof(tideParamInfo_t) */
  unsigned int version;     /* caller sets TIDE_PARAM_INFO_VERSION */
  uint64_t numel;
  uint64_t rowNumel;
  uint64_t shardNumel;      /* padded shard: ceil(rows / W) * rowNumel */
  tideDataType_t dtype;
  size_t elemSize;
  uint64_t sendOffset;      /* bytes, in the packed send buffer */
  uint64_t slotOffset;      /* bytes, in the slot; multiple of TIDE_SLOT_ALIGN */
  uint64_t rsOutOffset;     /* elements, in the packed RS output */
} tideParamInfo_t;

/* Fills *info for parameter index. Errors: tideInvalidArgument (NULL, index out of range,
 * bad size/version). (since 0.1) */
tideResult_t tideLayoutGetParam(tideLayout_t layout, int index, tideParamInfo_t* info);

/* Inter-node all-gather schedule ("rail" recursive doubling over nodes, Bruck-style so that
 * any node count works). Every rank takes part on its rail: the ranks with its local index
 * on every node. In round k (k = 0 .. ceil(log2 N) - 1) node n sends to node
 * (n - 2^k) mod N the blocks it holds of nodes n .. n + cnt - 1 (mod N), cnt = min(2^k, N - 2^k),
 * and receives from node (n + 2^k) mod N the blocks of nodes n + 2^k .. n + 2^k + cnt - 1.
 * A block is one rank's packed send buffer (sendBytes). Each round is cut into steps of at
 * most paceBytes; steps run one after another, so at most paceBytes are in flight per rank.
 * After the schedule, the node-local fan-out delivers every block to the other local ranks. */
#define TIDE_SCHEDULE_STEP_VERSION 1

typedef struct {
  size_t size;           /* caller sets sizeof(tideScheduleStep_t) */
  unsigned int version;  /* caller sets TIDE_SCHEDULE_STEP_VERSION */
  int round;
  int sendToNode;        /* node this step's data goes to */
  int recvFromNode;      /* node this step's data comes from */
  int sendBlockNode;     /* whose block is sent */
  int recvBlockNode;     /* whose block is received */
  uint64_t offset;       /* bytes into the block (packed send buffer layout) */
  uint64_t bytes;        /* 1 .. paceBytes */
} tideScheduleStep_t;

/* Number of steps node `node` executes into *count (0 for a single node).
 * Errors: tideInvalidArgument. (since 0.1) */
tideResult_t tideLayoutGetScheduleLength(tideLayout_t layout, int node, int* count);

/* Step `index` (0 .. count-1) of node `node`. Errors: tideInvalidArgument. (since 0.1) */
tideResult_t tideLayoutGetScheduleStep(tideLayout_t layout, int node, int index, tideScheduleStep_t* step);

/* ------------------------------------------------------------------------------------ */
/* Host executor: all W ranks simulated in one process (the oracle for every test)       */
/* ------------------------------------------------------------------------------------ */

/* All-gather over every rank. Pointer tables are indexed [rank * nParams + i]:
 *   shards[...]: rank's shard of parameter i, shardNumel_i elements of dtype_i (read only);
 *   params[...]: rank's unsharded storage of parameter i, shardNumel_i * W elements (written).
 * Follows the inter-node schedule when nNodes > 1, then the node-local fan-out.
 * Errors: tideInvalidArgument (a layout handle that is not live, NULL table or entry, an entry not aligned to its
 * element size, overlapping output). Nothing is written on error. (since 0.1) */
tideResult_t tideHostAllGather(tideLayout_t layout, const void* const* shards, void* const* params);

/* Reduce-scatter over every rank, in the accumulation order documented at the top.
 *   grads[rank * nParams + i]: rank's gradient of parameter i, numel_i elements of dtype_i,
 *     dtype_i one of bf16, fp16, fp32 (read only; no padding needed);
 *   outs[rank]: rank's packed output, rsOutNumel elements of outType (fp32, bf16 or fp16).
 * scale is used by tidePremulSum only (it must be finite for every op).
 * In place (NCCL's form, recvbuff = sendbuff + rank * recvcount): outs[r] may be exactly rank r's own block of its
 * own gradient, grads[r] + r * shardNumel * elemSize, when the layout has one parameter with rowNumel 1 and
 * numel = W * shardNumel (no padding) and outType is the gradient's dtype; the result equals the out-of-place one
 * bit for bit. Any other overlap of an output with a gradient or another output is refused.
 * Errors: tideInvalidArgument (NULL, bad op/outType, a parameter dtype that is not bf16/fp16/
 * fp32, non-finite scale, a gradient or output not aligned to its element size, an output overlapping another
 * output or any gradient other than in the in-place form above, a layout handle that is not live). Nothing is
 * written on error. NaN results are the canonical NaN of outType (see "NaN results" at the top). (since 0.1) */
tideResult_t tideHostReduceScatter(tideLayout_t layout, const void* const* grads, void* const* outs,
                                   tideDataType_t outType, tideRedOp_t op, float scale);

/* ------------------------------------------------------------------------------------ */
/* Parameters (NCCL_TIDE_* environment variables)                                        */
/* ------------------------------------------------------------------------------------ */

/* Number of registered parameters. (since 0.1) */
tideResult_t tideParamCount(int* count);

/* Describes parameter index: static strings, never freed. type is one of "bool", "int64",
 * "uint64", "bytes", "string"; value is the effective value as text (environment or
 * default). Any output pointer may be NULL. Errors: tideInvalidArgument (index out of
 * range), tideInvalidArgument if the environment holds a value that does not parse
 * (message names the variable and the accepted form). (since 0.1) */
tideResult_t tideParamDescribe(int index, const char** name, const char** type, const char** defaultValue,
                               const char** doc, const char** value);

/* ------------------------------------------------------------------------------------ */
/* Communicators and the CUDA data path                                                  */
/* (built only with CUDA; a host-only build returns tideUnsupported)                     */
/* ------------------------------------------------------------------------------------ */

typedef struct tideComm* tideComm_t;

/* Creates a loopback world: nRanks (2..8) virtual ranks in this process on CUDA device
 * `device`, each with its own comm handle, written to comms[0 .. nRanks-1]. Peer memory of
 * a virtual rank is the other virtual ranks' allocations. Used for tests and single-GPU
 * benchmarks; the executors do not know which provider they run on.
 * Errors: tideInvalidArgument, tideUnsupported (no CUDA build or device), tideCudaError.
 * On failure with comms non-NULL and nRanks in 2..8, comms[0 .. nRanks-1] are NULL (every build).
 * (since 0.1) */
tideResult_t tideLoopbackCreate(int nRanks, int device, tideComm_t* comms);

/* Releases a comm (for a loopback world: every comm of the world must be destroyed; the
 * shared resources go with the last). Waits for no device work: the caller synchronizes its
 * streams first; it does wait for a call on this comm in progress on another thread to return
 * (a call of another thread that has not started yet then fails with tideInvalidArgument).
 * Safe on NULL. Errors: tideInvalidArgument (a handle that is not live: destroyed, aborted,
 * garbage, or a tideLayout_t). (since 0.1) */
tideResult_t tideCommDestroy(tideComm_t comm);

/* Local, non-collective teardown for a failing job: the parent NCCL communicator was (or is
 * about to be) aborted, a peer died, or work is queued that waits for a peer that will never
 * come. Unlike tideCommDestroy it exchanges nothing with the peers (call it on any subset of
 * the ranks, in any order; it never calls the parent NCCL communicator, which may already be
 * freed) and waits for nothing without a bound: it waits for this rank's device work at most
 * NCCL_TIDE_TIMEOUT_MS, or 2000 ms when that is 0 (no bound configured); it also waits at
 * most that long for a call of another thread on this comm to return.
 * Then, on success, the handle is released exactly like tideCommDestroy (do not use it
 * again, do not destroy it): the comm's streams and events are released; if the device went
 * idle, this rank's mappings of the peers' memory are closed and its local memory is freed;
 * memory this rank exported to peers (slots, staging, flags of an IPC comm) stays allocated
 * until the process exits, because a peer's queued work may still write into it. If the
 * device did not go idle (a stuck wait), nothing that work may use is closed or freed: it is
 * left to process exit (one WARN says so), and the process can still exit normally.
 * Slots of the comm become invalid with the handle. Loopback worlds: aborting one virtual
 * rank makes the whole world unusable (every later call of its other ranks fails with
 * tideInvalidUsage; release them with tideCommAbort or tideCommDestroy); the world's memory
 * is freed with its last comm if the device went idle. Safe on NULL (tideSuccess).
 * Errors: tideTimeout (another thread stayed inside a call on this comm past the bound: the
 * handle is NOT released and stays valid), tideUnsupported (no CUDA build, non-NULL comm).
 * (since 0.1) */
tideResult_t tideCommAbort(tideComm_t comm);

/* Rank and world size of a comm. (since 0.1) */
tideResult_t tideCommGetRank(tideComm_t comm, int* rank, int* worldSize);

/* The comm's TIDE node size: ranks r and q are one node when r / ranksPerNode == q / ranksPerNode. Nodes follow
 * NCCL's hosts (NCCL_HOSTID honoured as NCCL does), or NCCL_TIDE_RANKS_PER_NODE when set; ranks of one node map
 * each other's memory, other nodes are reached through the inter-node transport. When the comm has several nodes,
 * a layout used on it must have a ranksPerNode that divides it. Errors: tideInvalidArgument (NULL), tideUnsupported (no CUDA build).
 * (since 0.1) */
tideResult_t tideCommGetRanksPerNode(tideComm_t comm, int* ranksPerNode);

/* Allocates `bytes` of peer-mapped device memory on this rank (a slot): the same call must be
 * made by every rank of the comm in the same order with the same size (collective for
 * NCCL comms; for a loopback world, once per virtual rank). *ptr is this rank's address.
 * Slots hold unsharded parameters (AG destination) and RS staging. (since 0.1) */
tideResult_t tideSlotAlloc(tideComm_t comm, size_t bytes, void** ptr);

/* Frees a slot (same collective rules). (since 0.1) */
tideResult_t tideSlotFree(tideComm_t comm, void* ptr);

/* TIDE-AG on a CUDA stream of the comm's device. Stream-ordered and asynchronous.
 *   sendbuff: this rank's packed send buffer (sendBytes), or NULL to use shardPtrs;
 *   shardPtrs: [nParams] this rank's shard of each parameter (when sendbuff is NULL);
 *   slot: start of a slot region of at least slotBytes (inside a tideSlotAlloc allocation,
 *     at the same offset on every rank); parameter i is written at slot + slotOffset_i. On a comm
 *     of world size 1 (nothing is peer-mapped) any device memory of the comm's device serves
 *     (since 0.1): the caller owns it and orders its reuse after this call's stream.
 * Every rank of the comm must make the matching call. No kernel is launched. Layouts may span
 * several nodes (ranksPerNode < worldSize: the inter-node rail schedule runs over the comm's
 * inter-node transport: peer-mapped copies where every rank maps every other, e.g. virtual nodes
 * on one host, else grouped ncclSend/ncclRecv; see tideCommGetRanksPerNode). The first call with a layout hash new to the comm
 * compares it across ranks (collective through the provider's exchange).
 * CUDA graphs (loopback worlds and tideCommCreate comms; on the latter, a layout must have been
 * used by an eager call first): on a stream
 * being captured, a single-node layout is captured with a replay-safe protocol (separate flag
 * words with fixed values, reset by their owner at the end: every replay equals an eager call;
 * docs/architecture.md "CUDA graphs"). Every rank captures its
 * call on its own stream and replays its graph in the common collective order; on a loopback
 * world each rank's graph holds one TIDE collective. What cannot be captured (layouts of
 * several nodes, a second collective in one loopback graph, a layout a tideCommCreate comm has
 * not agreed on yet) fails at capture time with
 * tideUnsupported, nothing enqueued, the capture still valid. A captured call does not query
 * the parent NCCL communicator's asynchronous error (no tideNcclError at capture time).
 * Errors (before any copy): tideInvalidArgument (NULL/misaligned pointers, slot not inside a
 * slot allocation, layout world/rank not matching the comm, stream of another device),
 * tideUnsupported (a call that cannot be captured, see above; the comm is unchanged),
 * tideMismatch (ranks use layouts of different hashes: on every rank), tideTimeout (that
 * comparison exceeded NCCL_TIDE_TIMEOUT_MS), tideNcclError (the parent NCCL communicator
 * reports an asynchronous error). (since 0.1) */
tideResult_t tideAllGather(tideComm_t comm, tideLayout_t layout, const void* sendbuff, const void* const* shardPtrs,
                           void* slot, void* stream);

/* TIDE-RS on a CUDA stream. grads: [nParams] this rank's gradient of each parameter
 * (numel_i elements, bf16/fp16/fp32, need not be registered). out: this rank's packed
 * output (rsOutNumel elements of outType). staging: a slot region of at least
 * rsStagingBytes at the same offset on every rank (Slot-Reuse: the group's vacated AG
 * slot; at world size 1 any device memory, as tideAllGather's slot), or NULL to use the comm's
 * own staging buffer. Same error rules as tideAllGather, and tideInvalidArgument when out overlaps a
 * gradient or the staging region, except NCCL's in-place form: out exactly this rank's own block of its gradient,
 * grads[0] + rank * shardNumel * elemSize, for a layout of one parameter with rowNumel 1 and numel =
 * W * shardNumel (no padding) and outType the gradient's dtype (every rank may choose for itself; the result
 * equals the out-of-place one bit for bit: each chunk of the own block is pushed into staging before that chunk
 * is reduced and written, and never read again).
 * CUDA graphs: captured (replay-safe, as tideAllGather) for a single-node layout with Slot-Reuse
 * staging and at most 2 pipeline chunks (rsNumChunks; raise rsChunkBytes otherwise), or up to
 * NCCL_TIDE_TOKEN_RS_CHUNKS chunks (64 by default) on a comm of one rank per process (not on a
 * loopback world; the pushes then run on a second branch of the graph, forked from and joined
 * back to the caller's stream).
 * Refused at capture time with tideUnsupported: staging NULL (own staging may have to grow:
 * collective, allocates), more chunks than that, several nodes. (since 0.1) */
tideResult_t tideReduceScatter(tideComm_t comm, tideLayout_t layout, const void* const* grads, void* out,
                               tideDataType_t outType, tideRedOp_t op, float scale, void* staging, void* stream);

/* Diagnostic text about a comm, for a suspected hang: where this rank's host thread is (inside a TIDE call, and
 * which step, or idle), the last AG/RS epoch and RS chunk numbers, every rank's flag words as this rank sees
 * them (read back through a separate stream on a helper thread, bounded to a few seconds: a readback that does
 * not finish is reported as such) and which waits of this rank's last AG and RS are not satisfied yet. Writes
 * at most `bytes` bytes, NUL-terminated (truncated if needed), into buf. Never blocks on the comm's streams or on
 * a call in progress on another thread. Errors: tideInvalidArgument (NULL comm or buf, bytes 0).
 * (since 0.1) */
tideResult_t tideCommDebugDump(tideComm_t comm, char* buf, size_t bytes);

#define TIDE_PENDING_WAIT_VERSION 1

/* One unsatisfied wait of a comm's last all-gather or reduce-scatter (tideCommGetPendingWaits). */
typedef struct {
  size_t size;            /* caller sets sizeof(tidePendingWait_t) in every element */
  unsigned int version;   /* caller sets TIDE_PENDING_WAIT_VERSION */
  int collective;         /* 0 all-gather, 1 reduce-scatter */
  int stream;             /* 0 the caller's stream, 1 the comm's internal stream */
  int step;               /* index of the step in the rank's program (docs/architecture.md "Step programs") */
  int owner;              /* rank whose flag word is waited on */
  int word;               /* flag word index */
  int writer;             /* rank that writes the value waited for */
  uint32_t expected;      /* the value waited for (cyclic >=) */
  uint32_t seen;          /* the word's value now */
  char name[24];          /* short name: agReady, agDone[s], rsEnter, rsConsumed, rsPushDone, rsFull[s], rsPrev,
                             rsFinal, agFinish, agRail[k], capAgReady[d], ... */
} tidePendingWait_t;

/* The first unsatisfied wait on each stream of this rank's last all-gather and last reduce-scatter (a stream runs
 * in order, so that is where it stands if it is stuck), read from their step programs and the flag words (read
 * back as tideCommDebugDump does, bounded). Writes up to `capacity` entries into waits and the number found into
 * *count (0: nothing pending). Errors: tideInvalidArgument (NULL comm or count, waits NULL with capacity > 0, bad
 * size/version), tideInvalidUsage (a call is in progress on this comm on another thread), tideCudaError (the
 * flag readback failed or did not finish). (since 0.2) */
tideResult_t tideCommGetPendingWaits(tideComm_t comm, tidePendingWait_t* waits, int capacity, int* count);

/* 1 if the NVLink multicast gate is open in this environment:
 * NCCL_NVLS_ENABLE is not "0", TORCH_SYMM_MEM_DISABLE_MULTICAST and NVSHMEM_DISABLE_NVLS
 * are unset, and NCCL_TIDE_NVLS=1. Host-only; always available. (since 0.1) */
tideResult_t tideMulticastAllowed(int* allowed);

/* ------------------------------------------------------------------------------------ */
/* NCCL binding: communicators over NCCL or a caller's bootstrap                         */
/* ------------------------------------------------------------------------------------ */

/* Feature bits of tideNcclInfo_t.features: present only if every named entry point is
 * exported by the loaded libnccl (looked up with dlsym; a missing one is never called).
 * (since 0.1) */
#define TIDE_NCCL_FEATURE_MEM_ALLOC (1ULL << 0)        /* ncclMemAlloc, ncclMemFree */
#define TIDE_NCCL_FEATURE_WINDOW_REGISTER (1ULL << 1)  /* ncclCommWindowRegister/Deregister */
#define TIDE_NCCL_FEATURE_WIN_GET_USER_PTR (1ULL << 2) /* ncclWinGetUserPtr (2.29.2) */
#define TIDE_NCCL_FEATURE_LSA_POINTERS (1ULL << 3)     /* ncclGetLsaDevicePointer, ncclGetPeerDevicePointer (2.29.2) */
#define TIDE_NCCL_FEATURE_LSA_MULTIMEM (1ULL << 4)     /* ncclGetLsaMultimemDevicePointer (2.29.2) */
#define TIDE_NCCL_FEATURE_PUT_SIGNAL (1ULL << 5)       /* ncclPutSignal, ncclSignal, ncclWaitSignal (2.29.2) */
#define TIDE_NCCL_FEATURE_QUERY_PROPERTIES (1ULL << 6) /* ncclCommQueryProperties (2.29.2) */
#define TIDE_NCCL_FEATURE_COLL_CONFIG (1ULL << 7)      /* ncclAllGatherConfig, ncclReduceScatterConfig (2.31.2) */

#define TIDE_NCCL_INFO_VERSION 1

/* (since 0.1) */
typedef struct {
  size_t size;              /* caller sets sizeof(tideNcclInfo_t) */
  unsigned int version;     /* caller sets TIDE_NCCL_INFO_VERSION */
  int headerVersion;        /* NCCL_VERSION_CODE of the nccl.h this library was built with, 0 if none */
  int runtimeVersion;       /* ncclGetVersion of the loaded libnccl, e.g. 22809 for 2.28.9 */
  int effectiveVersion;     /* runtimeVersion, or 23299 for 2.33+ (treated as 2.32, with a warning) */
  uint64_t features;        /* TIDE_NCCL_FEATURE_* bits */
  const char* provider;     /* peer-memory provider tideCommCreate tries with this NCCL and NCCL_TIDE_PROVIDER:
                               "window" (NCCL windows, NCCL >= 2.29.2; a comm falls back to "ipc" where NCCL
                               gives no window for its nodes) or "ipc" (CUDA IPC within a node); static string
                               (since 0.1; "window" since 0.2) */
  const char* transport;    /* inter-node transport: "sendrecv" (grouped ncclSend/ncclRecv; one-sided puts not built) */
} tideNcclInfo_t;

/* Finds the libnccl already loaded in this process (dlopen("libnccl.so.2", RTLD_NOLOAD):
 * TIDE never loads a second copy), reads its version and resolves its entry points. Host
 * only; needs no GPU. Logs the header and library versions at INFO on first success.
 * Errors: tideInvalidArgument (NULL, bad size/version, an invalid NCCL_TIDE_PROVIDER),
 * tideUnsupported (no libnccl loaded: load it first, e.g. import torch; a version older than
 * 2.28 or not 2.x; a 2.28 entry point missing; NCCL_TIDE_PROVIDER=window with an NCCL that
 * has no windows). (since 0.1) */
tideResult_t tideNcclGetInfo(tideNcclInfo_t* info);

/* Creates this rank's TIDE communicator over an NCCL communicator (an ncclComm_t, passed as
 * struct ncclComm*). Collective over the NCCL communicator: every rank calls it. Rank and
 * world come from ncclCommUserRank/ncclCommCount, the device from ncclCommCuDevice; host
 * bytes (host hash, config hash, IPC handles) are exchanged with ncclAllGather on an
 * internal stream. Provider within a TIDE node (NCCL's hosts, or NCCL_TIDE_RANKS_PER_NODE;
 * tideCommGetRanksPerNode), chosen by NCCL_TIDE_PROVIDER (docs/usage.md "Providers"): NCCL
 * windows (NCCL >= 2.29.2: ncclMemAlloc memory registered with ncclCommWindowRegister, on a
 * communicator split off per TIDE node when there are several), or CUDA IPC of TIDE's own
 * cudaMalloc memory, which every rank falls back to where NCCL gives no window for its
 * nodes; one INFO line names the provider and why. Between nodes: grouped
 * ncclSend/ncclRecv (logged once at INFO; they run NCCL's kernels). config may be NULL.
 * Destroy the TIDE comm (collective, tideCommDestroy) before the NCCL communicator.
 * Errors: tideInvalidArgument, tideUnsupported (no CUDA build, NCCL not loaded or out of
 * range, a node split NCCL's hosts do not allow, NCCL_TIDE_INTERNODE=rma,
 * NCCL_TIDE_PROVIDER=window where NCCL gives no window), tideMismatch (configs or provider
 * choices differ across ranks: on every rank), tideNcclError, tideCudaError. (since 0.1) */
struct ncclComm;
tideResult_t tideCommCreate(struct ncclComm* ncclComm, const tideConfig_t* config, tideComm_t* comm);

/* All-gather of host bytes for tideCommCreateWithBootstrap: writes worldSize blocks of
 * `bytes` into `all`, block r being rank r's `mine`. Blocking and collective; returns 0 on
 * success, tideTimeout (9) if it gave up waiting for a peer (reported as tideTimeout), anything
 * else is an error (reported as tideSystemError). (since 0.1) */
typedef int (*tideAllGatherFn_t)(const void* mine, void* all, size_t bytes, void* user);

#define TIDE_BOOTSTRAP_VERSION 1

/* (since 0.1) */
typedef struct {
  size_t size;                  /* sizeof(tideBootstrap_t) */
  unsigned int version;         /* TIDE_BOOTSTRAP_VERSION */
  tideAllGatherFn_t allgather;  /* called during create, tideSlotAlloc/Free, own-staging growth inside
                                   tideReduceScatter, and tideCommDestroy: keep it (and user) valid until then */
  void* user;                   /* passed to allgather */
} tideBootstrap_t;

/* Like tideCommCreate, with the exchange done by the caller's all-gather (e.g. over a
 * torch.distributed gloo group) instead of NCCL: for ranks NCCL cannot form, such as several
 * processes sharing one GPU. One rank per process, all on one host; device is this rank's
 * CUDA device (ranks may share it). Collective over the bootstrap.
 * Errors: as tideCommCreate, plus tideInvalidUsage (two ranks in one process) and
 * tideSystemError (the callback failed). (since 0.1) */
tideResult_t tideCommCreateWithBootstrap(int rank, int worldSize, int device, const tideBootstrap_t* bootstrap,
                                         const tideConfig_t* config, tideComm_t* comm);

/* Name of the comm's peer-memory provider ("loopback", "ipc", "window"); a static string.
 * Errors: tideInvalidArgument. (since 0.1; "window" since 0.2) */
tideResult_t tideCommGetProvider(tideComm_t comm, const char** name);

/* ------------------------------------------------------------------------------------ */
/* Layout-aware calls through the NCCL_TIDE_ENABLE interposer (docs/usage.md)            */
/* ------------------------------------------------------------------------------------ */

/* Attaches `layout` (this rank's layout of a parameter group on the ranks of `ncclComm`,
 * worldSize = the communicator's size) to `buffer`, so that eligible interposed calls on
 * `ncclComm` use the layout instead of NCCL's flat rank-major blocks:
 *   ncclAllGather(sendbuff, buffer, sendcount, datatype, ncclComm, stream) with
 *     sendcount * size(datatype) >= the layout's sendBytes (sendbuff starts with the packed
 *     send buffer) and worldSize * sendcount * size(datatype) >= slotBytes leaves the layout's
 *     slot image in the first slotBytes of `buffer`: parameter i's unsharded storage at
 *     buffer + slotOffset_i, rank r's shard at + r * shardNumel_i elements (pad sendcount so
 *     that the NCCL-sized buffer covers slotBytes; bytes past slotBytes are not written).
 *   ncclReduceScatter(buffer, recvbuff, recvcount, datatype, ncclSum, ncclComm, stream) with
 *     recvcount >= rsOutNumel, worldSize * recvcount * size(datatype) >= slotBytes and
 *     datatype the layout's (single) gradient type reads parameter i's full gradient at
 *     buffer + slotOffset_i (the same image) and writes the first rsOutNumel elements of
 *     recvbuff packed by the layout (parameter i's shard at rsOutOffset_i), in the call's
 *     datatype, with TIDE's fp32 accumulation in the documented order.
 * Every rank attaches a layout of the same hash (else the first call fails the layout
 * agreement on every rank and TIDE turns itself off for the communicator: NCCL then runs
 * the flat call). A call that does not match (sizes, type) runs as a flat call. The other
 * eligibility rules are those of flat calls. The all-gather still lands in a TIDE bounce
 * slot first and reaches `buffer` by one copy-engine copy (an application buffer is not
 * peer-mapped). The attachment holds its own reference to the layout until tideDetachLayout, or until the
 * communicator is finalized, destroyed or aborted (which drops its attachments): the caller may destroy its
 * handle meanwhile. Re-attaching a buffer replaces its layout.
 * Errors: tideInvalidArgument (NULL argument; a layout handle that is not live, in every build),
 * tideUnsupported (a build without CUDA).
 * (since 0.1) */
tideResult_t tideAttachLayout(struct ncclComm* ncclComm, void* buffer, tideLayout_t layout);

/* Removes the attachment of `buffer` on `ncclComm`.
 * Errors: tideInvalidArgument (NULL argument, nothing attached there). (since 0.1) */
tideResult_t tideDetachLayout(struct ncclComm* ncclComm, void* buffer);

/* What the interposer did with the all-gathers and reduce-scatters it saw: calls and bytes (per rank: count times
 * the element size) taken by TIDE, and passed to NCCL per reason. Index [0] is ncclAllGather, [1]
 * ncclReduceScatter (the ...Config variants included); reason r >= 1 is described by
 * tideInterposerReasonString(r). */
#define TIDE_INTERPOSER_COUNTERS_VERSION 1
#define TIDE_INTERPOSER_MAX_REASONS 32
typedef struct {
  size_t size;            /* sizeof(tideInterposerCounters_t), set by the caller */
  unsigned int version;   /* TIDE_INTERPOSER_COUNTERS_VERSION, set by the caller */
  uint64_t takenCalls[2];
  uint64_t takenBytes[2];
  uint64_t forwardedCalls[2][TIDE_INTERPOSER_MAX_REASONS];
  uint64_t forwardedBytes[2][TIDE_INTERPOSER_MAX_REASONS];
  /* Of the taken all-gathers, those gathered into TIDE's bounce slot and copied out to recvbuff (a same-device copy
   * of W times the bytes, which runs on SMs); the others were gathered straight into recvbuff, a buffer in a window
   * registered with NCCL_WIN_COLL_SYMMETRIC. */
  uint64_t allGatherCopyOutCalls;
  uint64_t allGatherCopyOutBytes;
} tideInterposerCounters_t;

/* The counters of the NCCL communicator `ncclComm` since it was first seen (all zero for one never seen or already
 * finalized, destroyed or aborted), or, with ncclComm NULL, of every communicator of the process since it started.
 * Counts only while NCCL_TIDE_ENABLE=1. Errors: tideInvalidArgument (NULL out, size or version not this header's).
 * (since 0.1) */
tideResult_t tideInterposerGetCounters(struct ncclComm* ncclComm, tideInterposerCounters_t* out);

/* The reason with index `reason` of tideInterposerCounters_t (a static string), or NULL past the last one.
 * (since 0.1) */
const char* tideInterposerReasonString(int reason);

#ifdef __cplusplus
}
#endif

#endif /* NCCL_TIDE_H_ */
