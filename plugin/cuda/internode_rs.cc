// TIDE-RS over several (virtual) nodes, bit-exact with the accumulation order of include/tide.h:
//   partial(node j) = left fold over the node's ranks; total = ((partial(0) + partial(1)) + ...) + partial(N-1);
//   AVG divides by W last; then fp32 or RNE bf16/fp16.
//
// Roles. Rank me = node n, local index q. For output owner d = (m, q) the rank (j, q) of every node j (the owner's
// rail) is its proxy on node j: the ranks of node j push their gradient chunk for d into the proxy's staging, as on a
// single node, and the proxy folds them. The running sum then travels along the rail in node order:
//   proxy (0, q):      acc = partial(0)                                   -> put into (1, q)'s partial slot
//   proxy (j, q):      acc = prev + partial(j)   (prev = the sum so far)  -> put into (j+1, q)'s partial slot
//   proxy (N-1, q):    total = post(prev + partial(N-1))                  -> the owner's out (if it is the owner) or a
//                      put of the fp32 total into the owner's partial slot; the owner then copies it into out (fp32:
//                      copy engine) or narrows it (bf16/fp16: the reduce kernel with one fp32 input)
// fp32 adds are commutative, so prev + partial(j) is bit for bit the host's total + partial(j).
//
// Pipeline. Tasks t = k * N + m (chunk k of this rank's rail owner on node m), the same order on every rank; task t
// uses staging buffer b = t % nb (one fp32 partial chunk + R inputs: rs_plan.cc's size, independent of W) and has
// the global number g_t = g0 + t + 1 (comm->rsChunkSeq advances by numChunks * N per call: monotonic, equal on every
// rank). Flags:
//   full[l] (kRsFull + l)  input of local rank l for task g_t is in the proxy's staging   (writer: rank (n, l))
//   prev    (kRsPrev)      the running sum of task g_t is in the proxy's partial slot     (writer: (n-1, q))
//   final   (kRsFinal)     the total of task g_t is in the owner's partial slot           (writer: (N-1, q))
//   consumed               the proxy is done with task g_t's buffer (inputs, partial slot) (writer: the proxy)
//   enter / pushDone       as on a single node
// Side stream (pushes), task t: wait every local proxy's enter >= e and consumed >= g0 (t < nb) or consumed >=
//   g_{t-nb}; push into every local proxy; write full[me's local index] = g_t into each; at the end pushDone = e.
// Caller stream, task t: wait full[0..R-1] >= g_t and (n > 0) prev >= g_t; reduce kernel into the partial slot (or
//   out); (n < N-1) wait the next proxy's credit (enter/consumed as the pushes do), put the partial, signal prev;
//   (n = N-1, owner elsewhere) put the total into the owner's partial slot, signal final; (owner, n < N-1) wait
//   final >= g_t, copy or narrow into out; write consumed = g_t. Finally wait own pushDone >= e.
// The final lands in the owner's partial slot without a credit wait: it is caused by the owner's own put of task t
// (whose signal follows the put's completion on the owner's stream), and the owner releases the buffer (consumed) only
// after it has waited for the final and copied it out.
//
// Deadlock freedom, by induction over t: task t of any rank needs (i) the pushes of task t, which need the consumed
// of task t - nb of the local proxies, (ii) the running sum of task t from the rail's previous node, which needs
// (i) there and its own predecessor, down to node 0, (iii) for a put, the next proxy's consumed of task t - nb, and
// (iv) for an owner, the final of task t, which needs (i)-(iii) of task t along the rail. Nothing of task t waits for
// a task > t, and every stream issues its tasks in increasing t, so if every task < t completes, task t completes.
// The loopback provider issues the pushes of all virtual ranks task-major once every rank has called (they share the
// device's copy-engine queues; PeerProvider::schedulePushes); providers that do not defer get the two streams
// interleaved in host order (no wait enqueued before the operation of this process that satisfies it), as on one
// node.
//
// Cost against a single node of the same W (why this is a correctness vehicle first): each rank runs N times as many
// pipeline steps (kernels of R inputs instead of W), and the fp32 running sum crosses N - 1 hops (plus one to the
// owner) per chunk in sequence, so the chain adds latency of about N steps per chunk, overlapped with the pushes of
// the next task only as far as nb = 2 buffers allow. An owner waits for its final on its caller stream, which holds
// back its own later tasks: a stall of one chain latency per owned chunk.
#include <algorithm>
#include <cinttypes>
#include <memory>
#include <vector>

#include "../core/errors.h"
#include "../core/log.h"
#include "copy_batch.h"
#include "driver_ops.h"
#include "executors.h"
#include "internode_transport.h"
#include "reduce_kernel.h"

namespace tide {
namespace cuda {

tideResult_t reduceScatterMultiNode(const RsCall& c) {
  tideComm* comm = c.comm;
  const LayoutView& v = *c.v;
  const int R = v.info.ranksPerNode, N = v.info.nNodes;
  const int me = comm->rank, n = me / R, q = me % R;
  const int nParams = v.info.nParams;
  const int numTasks = c.numChunks * N;
  const int nb = c.nb;
  const uint32_t e = c.epoch;
  const uint64_t g0 = c.g0;
  PeerProvider* pp = comm->provider.get();
  uint32_t* own = pp->flags(me, me);
  size_t zeroBytes = 0;
  const char* zeros = static_cast<const char*>(pp->zeros(&zeroBytes));
  // Buffer layout: the fp32 partial chunk first (so it is 4-byte aligned, and 16-byte aligned whenever chunks are
  // multiples of 8 elements, even when a single odd-sized bf16 chunk makes R * srcStride not a multiple of 4), then
  // the R inputs. Same total as rs_plan.cc (which lists the partial after the inputs; the order inside a buffer is
  // the executor's choice).
  const uint64_t inputsOffset = c.chunk * sizeof(float);
  auto gOf = [g0](int t) { return static_cast<uint32_t>(g0 + static_cast<uint64_t>(t) + 1); };
  // Waits for "the buffer of task t on rank x is free" (the pushes' and the puts' credit).
  auto creditOps = [&](int t, int x, std::vector<FlagOp>* ops) {
    uint32_t* fx = pp->flags(me, x);
    if (t < nb) {
      ops->push_back({FlagOp::kWait, fx + flag::kRsEnter, e});
      ops->push_back({FlagOp::kWait, fx + flag::kRsConsumed, static_cast<uint32_t>(g0)});
    } else {
      ops->push_back({FlagOp::kWait, fx + flag::kRsConsumed, gOf(t - nb)});
    }
  };

  // Phase 1 (side stream), planned now and issued by the provider: task t pushes this rank's gradient chunk k for
  // owner (m, l) into the staging of its local proxy (n, l), input slot q, for every local l.
  struct PushPlan {
    cudaStream_t side;
    int device;
    std::vector<std::vector<FlagOp>> before, after;
    std::vector<CopyList> copies;
    uint32_t* pushDone;
    uint32_t epoch;
  };
  auto plan = std::make_shared<PushPlan>();
  plan->side = comm->sideStream;
  plan->device = comm->device;
  plan->before.resize(numTasks);
  plan->after.resize(numTasks);
  plan->copies.resize(numTasks);
  plan->pushDone = own + flag::kRsPushDone;
  plan->epoch = e;
  int pi = 0;  // first parameter that can overlap the current chunk (chunks never decrease with t)
  for (int t = 0; t < numTasks; ++t) {
    const int k = t / N, m = t % N, b = t % nb;
    const uint64_t c0 = static_cast<uint64_t>(k) * c.chunk;
    const uint64_t c1 = std::min(c0 + c.chunk, v.info.rsOutNumel);
    for (int l = 0; l < R; ++l) creditOps(t, n * R + l, &plan->before[t]);
    CopyList& copies = plan->copies[t];
    while (pi < nParams && v.params[pi].rsOutOffset + v.params[pi].shardNumel <= c0) ++pi;
    for (int dl = 0; dl < R; ++dl) {
      const int l = (q + dl) % R;
      const int x = n * R + l;  // proxy
      const int d = m * R + l;  // owner of the output chunk
      char* dst = c.stagingOf[x] + static_cast<uint64_t>(b) * c.bufBytes + inputsOffset +
                  static_cast<uint64_t>(q) * c.srcStride;
      for (int i = pi; i < nParams && v.params[i].rsOutOffset < c1; ++i) {
        const tideParamInfo_t& p = v.params[i];
        const uint64_t lo = std::max(c0, p.rsOutOffset), hi = std::min(c1, p.rsOutOffset + p.shardNumel);
        if (lo >= hi) continue;
        const uint64_t pos = lo - p.rsOutOffset;
        const uint64_t j = static_cast<uint64_t>(d) * p.shardNumel + pos;
        const uint64_t count = hi - lo;
        const uint64_t valid = j >= p.numel ? 0 : std::min(count, p.numel - j);
        char* to = dst + (lo - c0) * c.inElem;
        copies.add(to, static_cast<const char*>(c.grads[i]) + j * c.inElem, valid * c.inElem);
        for (uint64_t z = valid * c.inElem; z < count * c.inElem; z += zeroBytes) {
          copies.add(to + z, zeros, std::min<uint64_t>(zeroBytes, count * c.inElem - z));
        }
      }
    }
    for (int l = 0; l < R; ++l) {
      plan->after[t].push_back({FlagOp::kWrite, pp->flags(me, n * R + l) + flag::kRsFull + q, gOf(t)});
    }
  }

  PeerMappedTransport net(pp, me, comm->device);
  cudaStream_t stream = c.stream;
  // Phase 2 and the rail chain (caller stream), task t.
  auto enqueueTask = [&](int t) -> tideResult_t {
    const int k = t / N, m = t % N, b = t % nb;
    const uint64_t c0 = static_cast<uint64_t>(k) * c.chunk;
    const uint64_t c1 = std::min(c0 + c.chunk, v.info.rsOutNumel);
    const uint64_t cnt = c1 - c0;
    const uint32_t gt = gOf(t);
    const bool last = n == N - 1, owner = m == n;
    char* buf = c.stagingOf[me] + static_cast<uint64_t>(b) * c.bufBytes;
    float* partial = reinterpret_cast<float*>(buf);
    char* outChunk = static_cast<char*>(c.out) + c0 * c.outElem;

    std::vector<FlagOp> ops;
    for (int l = 0; l < R; ++l) ops.push_back({FlagOp::kWait, own + flag::kRsFull + l, gt});
    if (n > 0) ops.push_back({FlagOp::kWait, own + flag::kRsPrev, gt});
    TIDE_CHECK(enqueueFlagOps(stream, ops));

    ReduceArgs a;
    a.staging = buf + inputsOffset;
    a.srcStride = c.srcStride;
    a.nSrc = R;
    a.n = cnt;
    a.inType = c.inType;
    a.scale = c.scale;
    a.divisor = static_cast<float>(v.info.worldSize);
    a.prev = n > 0 ? partial : nullptr;
    if (last && owner) {
      a.out = outChunk;
      a.outType = c.outType;
      a.op = c.op;
    } else {
      a.out = partial;  // in place over prev (same element, same thread) when n > 0
      a.outType = tideFloat32;
      a.op = (!last && c.op == tideAvg) ? tideSum : c.op;  // AVG divides once, after the last node's add
    }
    TIDE_CHECK(launchReduce(a, stream));

    CopyList put;
    if (!last) {
      const int next = (n + 1) * R + q;
      ops.clear();
      creditOps(t, next, &ops);
      TIDE_CHECK(enqueueFlagOps(stream, ops));
      put.add(c.stagingOf[next] + static_cast<uint64_t>(b) * c.bufBytes, partial, cnt * sizeof(float));
      TIDE_CHECK(net.put(stream, next, put));
      TIDE_CHECK(net.signal(stream, next, flag::kRsPrev, gt));
    } else if (!owner) {
      const int d = m * R + q;
      put.add(c.stagingOf[d] + static_cast<uint64_t>(b) * c.bufBytes, partial, cnt * sizeof(float));
      TIDE_CHECK(net.put(stream, d, put));
      TIDE_CHECK(net.signal(stream, d, flag::kRsFinal, gt));
    }
    if (owner && !last) {
      TIDE_CHECK(net.waitSignal(stream, flag::kRsFinal, gt));
      if (c.outType == tideFloat32) {
        CopyList cp;
        cp.add(outChunk, partial, cnt * sizeof(float));
        TIDE_CHECK(cp.enqueue(stream, comm->device));
      } else {
        ReduceArgs f;
        f.staging = partial;
        f.srcStride = 0;
        f.nSrc = 1;
        f.n = cnt;
        f.out = outChunk;
        f.inType = tideFloat32;
        f.outType = c.outType;
        f.op = tideSum;
        f.scale = 1.0f;
        f.divisor = 1.0f;
        TIDE_CHECK(launchReduce(f, stream));
      }
    }
    return enqueueFlagOps(stream, {FlagOp{FlagOp::kWrite, own + flag::kRsConsumed, gt}});
  };
  PeerProvider::IssueFn issue = [plan, numTasks](int t) -> tideResult_t {
    if (t == numTasks) return enqueueFlagOps(plan->side, {FlagOp{FlagOp::kWrite, plan->pushDone, plan->epoch}});
    TIDE_CHECK(enqueueFlagOps(plan->side, plan->before[t]));
    TIDE_CHECK(plan->copies[t].enqueue(plan->side, plan->device));
    return enqueueFlagOps(plan->side, plan->after[t]);
  };

  comm->phase.store("tideReduceScatter: enqueueing (multi-node)", std::memory_order_relaxed);
  TIDE_CHECK(enqueueFlagOps(stream, {FlagOp{FlagOp::kWrite, own + flag::kRsEnter, e}}));
  if (pp->defersPushes()) {
    for (int t = 0; t < numTasks; ++t) TIDE_CHECK(enqueueTask(t));
    TIDE_CHECK(enqueueFlagOps(stream, {FlagOp{FlagOp::kWait, own + flag::kRsPushDone, e}}));
    TIDE_CHECK(pp->schedulePushes(me, static_cast<uint64_t>(comm->rsEpoch), numTasks, std::move(issue)));
  } else {
    for (int t = 0; t < nb && t < numTasks; ++t) TIDE_CHECK(issue(t));
    for (int t = 0; t < numTasks; ++t) {
      TIDE_CHECK(enqueueTask(t));
      if (t + nb < numTasks) TIDE_CHECK(issue(t + nb));
    }
    TIDE_CHECK(issue(numTasks));
    TIDE_CHECK(enqueueFlagOps(stream, {FlagOp{FlagOp::kWait, own + flag::kRsPushDone, e}}));
  }
  TIDE_TRACE("Cuda", "RS rank %d (node %d of %d, rail %d) epoch %u: %d chunks x %d nodes = %d tasks of %" PRIu64
             " elements", me, n, N, q, e, c.numChunks, N, numTasks, c.chunk);
  return tideSuccess;
}

}  // namespace cuda
}  // namespace tide
