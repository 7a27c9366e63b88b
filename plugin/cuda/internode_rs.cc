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
// Pushes (internal stream), task t: wait every local proxy's enter >= e and consumed >= g0 (t < nb) or consumed >=
//   g_{t-nb}; push into every local proxy; write full[me's local index] = g_t into each; at the end pushDone = e.
// Reduce (caller stream; on loopback the internal stream, see below), task t:
//   wait full[0..R-1] >= g_t and (n > 0) prev >= g_t; reduce kernel into the partial slot (or
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
//
// Issue order and shared copy-engine queues. A copy waits in its copy-engine queue for the memop waits before it on
// its stream, and blocks what is queued behind it; the loopback provider's virtual ranks all feed one device's
// queues. So a provider that defers (PeerProvider::defersPushes) gets the whole multi-node RS of a rank on the comm's
// internal stream as steps 3t (push of task t), 3t + 1 (waits, reduce, put and signal of task t), 3t + 2 (final
// wait, copy-out, consumed of task t) and 3T (pushDone), issued step-major, rank-minor across all ranks once every
// rank has called (PeerProvider::scheduleSteps). Every copy then waits only for copies issued before it: the pushes
// of task t wait for consumed of task t - nb (step 3(t-nb) + 2); a put of task t for the pushes of task t (step 3t)
// and the put of the rail's previous node (same step, lower rank: ranks are numbered node-major); a copy-out for the
// final put (step 3t + 1). The caller's stream gets, at call time, "write enter = e" (the internal stream's first
// waits include it: the caller's earlier work is done) and "wait own pushDone >= e" (written last): stream order for
// the caller is kept, at the price of no overlap between a task's pushes and the previous task's reduce on one
// rank. Providers that do not defer (IPC: one rank per process) keep the two streams, interleaved in host order so
// that no wait of this process is enqueued before the operation of this process that satisfies it: pushes of tasks
// 0 .. nb-1, then per task t its caller-stream work and the pushes of task t + nb (copies of one process are then
// queued in its own dependency order).
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
#include "loopback.h"
#include "reduce_kernel.h"

namespace tide {
namespace cuda {
namespace {

// Everything the tasks need, owned (a deferring provider issues them during another rank's call).
struct RsPlan {
  std::shared_ptr<PeerProvider> provider;
  int me = 0, n = 0, q = 0, R = 0, N = 0, W = 0, numTasks = 0, nb = 1, device = 0;
  uint32_t e = 0;
  uint64_t g0 = 0, chunk = 0, outNumel = 0, srcStride = 0, bufBytes = 0, inputsOffset = 0;
  size_t outElem = 0;
  char* out = nullptr;
  tideDataType_t inType = tideFloat32, outType = tideFloat32;
  tideRedOp_t op = tideSum;
  float scale = 1.0f;
  std::vector<char*> stagingOf;
  // Pushes of task t: credits, copies, full[q] writes.
  std::vector<std::vector<FlagOp>> before, after;
  std::vector<CopyList> copies;

  uint32_t g(int t) const { return static_cast<uint32_t>(g0 + static_cast<uint64_t>(t) + 1); }
  uint32_t* flags(int owner) const { return provider->flags(me, owner); }
  // Waits for "the buffer of task t on rank x is free" (the pushes' and the puts' credit).
  void credit(int t, int x, std::vector<FlagOp>* ops) const {
    if (t < nb) {
      ops->push_back({FlagOp::kWait, flags(x) + flag::kRsEnter, e});
      ops->push_back({FlagOp::kWait, flags(x) + flag::kRsConsumed, static_cast<uint32_t>(g0)});
    } else {
      ops->push_back({FlagOp::kWait, flags(x) + flag::kRsConsumed, g(t - nb)});
    }
  }

  tideResult_t push(int t, cudaStream_t s) const {
    TIDE_CHECK(enqueueFlagOps(s, before[t]));
    TIDE_CHECK(copies[t].enqueue(s, device));
    return enqueueFlagOps(s, after[t]);
  }

  // Waits for the inputs (and the running sum), the reduce kernel, and the put onward (or the final put to the owner).
  tideResult_t reduceAndPut(int t, cudaStream_t s) const {
    const int k = t / N, m = t % N, b = t % nb;
    const uint64_t c0 = static_cast<uint64_t>(k) * chunk;
    const uint64_t cnt = std::min(c0 + chunk, outNumel) - c0;
    const uint32_t gt = g(t);
    const bool last = n == N - 1, owner = m == n;
    char* buf = stagingOf[me] + static_cast<uint64_t>(b) * bufBytes;
    float* partial = reinterpret_cast<float*>(buf);
    std::vector<FlagOp> ops;
    for (int l = 0; l < R; ++l) ops.push_back({FlagOp::kWait, flags(me) + flag::kRsFull + l, gt});
    if (n > 0) ops.push_back({FlagOp::kWait, flags(me) + flag::kRsPrev, gt});
    TIDE_CHECK(enqueueFlagOps(s, ops));
    ReduceArgs a;
    a.staging = buf + inputsOffset;
    a.srcStride = srcStride;
    a.nSrc = R;
    a.n = cnt;
    a.inType = inType;
    a.scale = scale;
    a.divisor = static_cast<float>(W);
    a.prev = n > 0 ? partial : nullptr;
    if (last && owner) {
      a.out = out + c0 * outElem;
      a.outType = outType;
      a.op = op;
    } else {
      a.out = partial;  // in place over prev (same element, same thread) when n > 0
      a.outType = tideFloat32;
      a.op = (!last && op == tideAvg) ? tideSum : op;  // AVG divides once, after the last node's add
    }
    TIDE_CHECK(launchReduce(a, s));
    PeerMappedTransport net(provider.get(), me, device);
    CopyList put;
    if (!last) {
      const int next = (n + 1) * R + q;
      ops.clear();
      credit(t, next, &ops);
      TIDE_CHECK(enqueueFlagOps(s, ops));
      put.add(stagingOf[next] + static_cast<uint64_t>(b) * bufBytes, partial, cnt * sizeof(float));
      TIDE_CHECK(net.put(s, next, put));
      return net.signal(s, next, flag::kRsPrev, gt);
    }
    if (!owner) {
      const int d = m * R + q;
      put.add(stagingOf[d] + static_cast<uint64_t>(b) * bufBytes, partial, cnt * sizeof(float));
      TIDE_CHECK(net.put(s, d, put));
      return net.signal(s, d, flag::kRsFinal, gt);
    }
    return tideSuccess;
  }

  // An owner before the last node: wait for the final and copy (fp32) or narrow it into out. Then release the buffer.
  tideResult_t finish(int t, cudaStream_t s) const {
    const int k = t / N, m = t % N, b = t % nb;
    const uint64_t c0 = static_cast<uint64_t>(k) * chunk;
    const uint64_t cnt = std::min(c0 + chunk, outNumel) - c0;
    const uint32_t gt = g(t);
    if (m == n && n != N - 1) {
      const float* partial = reinterpret_cast<const float*>(stagingOf[me] + static_cast<uint64_t>(b) * bufBytes);
      char* outChunk = out + c0 * outElem;
      PeerMappedTransport net(provider.get(), me, device);
      TIDE_CHECK(net.waitSignal(s, flag::kRsFinal, gt));
      if (outType == tideFloat32) {
        CopyList cp;
        cp.add(outChunk, partial, cnt * sizeof(float));
        TIDE_CHECK(cp.enqueue(s, device));
      } else {
        ReduceArgs f;
        f.staging = partial;
        f.srcStride = 0;
        f.nSrc = 1;
        f.n = cnt;
        f.out = outChunk;
        f.inType = tideFloat32;
        f.outType = outType;
        f.op = tideSum;
        f.scale = 1.0f;
        f.divisor = 1.0f;
        TIDE_CHECK(launchReduce(f, s));
      }
    }
    return enqueueFlagOps(s, {FlagOp{FlagOp::kWrite, flags(me) + flag::kRsConsumed, gt}});
  }
};

}  // namespace

tideResult_t reduceScatterMultiNode(const RsCall& c) {
  tideComm* comm = c.comm;
  const LayoutView& v = *c.v;
  auto plan = std::make_shared<RsPlan>();
  RsPlan& P = *plan;
  P.provider = comm->provider;
  P.R = v.info.ranksPerNode;
  P.N = v.info.nNodes;
  P.W = v.info.worldSize;
  P.me = comm->rank;
  P.n = P.me / P.R;
  P.q = P.me % P.R;
  P.numTasks = c.numChunks * P.N;
  P.nb = c.nb;
  P.device = comm->device;
  P.e = c.epoch;
  P.g0 = c.g0;
  P.chunk = c.chunk;
  P.outNumel = v.info.rsOutNumel;
  P.srcStride = c.srcStride;
  P.bufBytes = c.bufBytes;
  // Buffer layout: the fp32 partial chunk first (so it is 4-byte aligned, and 16-byte aligned whenever chunks are
  // multiples of 8 elements, even when a single odd-sized bf16 chunk makes R * srcStride not a multiple of 4), then
  // the R inputs. Same total as rs_plan.cc (which lists the partial after the inputs; the order inside a buffer is
  // the executor's choice).
  P.inputsOffset = c.chunk * sizeof(float);
  P.outElem = c.outElem;
  P.out = static_cast<char*>(c.out);
  P.inType = c.inType;
  P.outType = c.outType;
  P.op = c.op;
  P.scale = c.scale;
  P.stagingOf = c.stagingOf;
  const int R = P.R, N = P.N, n = P.n, q = P.q, me = P.me, numTasks = P.numTasks, nb = P.nb;
  const int nParams = v.info.nParams;
  PeerProvider* pp = comm->provider.get();
  uint32_t* own = pp->flags(me, me);
  size_t zeroBytes = 0;
  const char* zeros = static_cast<const char*>(pp->zeros(&zeroBytes));

  // Pushes, planned now: task t pushes this rank's gradient chunk k for owner (m, l) into the staging of its local
  // proxy (n, l), input slot q, for every local l.
  P.before.resize(numTasks);
  P.after.resize(numTasks);
  P.copies.resize(numTasks);
  int pi = 0;  // first parameter that can overlap the current chunk (chunks never decrease with t)
  for (int t = 0; t < numTasks; ++t) {
    const int k = t / N, m = t % N, b = t % nb;
    const uint64_t c0 = static_cast<uint64_t>(k) * c.chunk;
    const uint64_t c1 = std::min(c0 + c.chunk, v.info.rsOutNumel);
    for (int l = 0; l < R; ++l) P.credit(t, n * R + l, &P.before[t]);
    CopyList& copies = P.copies[t];
    while (pi < nParams && v.params[pi].rsOutOffset + v.params[pi].shardNumel <= c0) ++pi;
    for (int dl = 0; dl < R; ++dl) {
      const int l = (q + dl) % R;
      const int x = n * R + l;  // proxy
      const int d = m * R + l;  // owner of the output chunk
      char* dst = c.stagingOf[x] + static_cast<uint64_t>(b) * c.bufBytes + P.inputsOffset +
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
    for (int l = 0; l < R; ++l) P.after[t].push_back({FlagOp::kWrite, pp->flags(me, n * R + l) + flag::kRsFull + q, P.g(t)});
  }

  comm->phase.store("tideReduceScatter: enqueueing (multi-node)", std::memory_order_relaxed);
  cudaStream_t stream = c.stream, side = comm->sideStream;
  const uint32_t e = P.e;
  comm->lastRsMulti = tideComm::MultiRecord{static_cast<uint64_t>(comm->rsEpoch), R, 0, pp->defersPushes()};
  if (pp->defersPushes()) {
    // Caller's stream: enter (the internal stream's first credits include it), then wait for the internal stream's
    // last step. The internal stream runs every step, issued step-major across ranks by the provider, which first
    // checks that they can be issued (no caller-stream wait for steps that will never come).
    if (auto* lb = dynamic_cast<LoopbackProvider*>(pp)) {
      TIDE_CHECK(lb->precheckSteps(me, CollKind::kReduceScatter, static_cast<uint64_t>(comm->rsEpoch), 3 * numTasks));
    }
    TIDE_CHECK(enqueueFlagOps(stream, {FlagOp{FlagOp::kWrite, own + flag::kRsEnter, e},
                                       FlagOp{FlagOp::kWait, own + flag::kRsPushDone, e}}));
    PeerProvider::IssueFn issue = [plan, side](int s) -> tideResult_t {
      const int t = s / 3;
      if (t == plan->numTasks) {
        return enqueueFlagOps(side, {FlagOp{FlagOp::kWrite, plan->flags(plan->me) + flag::kRsPushDone, plan->e}});
      }
      switch (s % 3) {
        case 0:
          return plan->push(t, side);
        case 1:
          return plan->reduceAndPut(t, side);
        default:
          return plan->finish(t, side);
      }
    };
    TIDE_CHECK(pp->scheduleSteps(me, CollKind::kReduceScatter, static_cast<uint64_t>(comm->rsEpoch), 3 * numTasks,
                                 std::move(issue)));
  } else {
    TIDE_CHECK(enqueueFlagOps(stream, {FlagOp{FlagOp::kWrite, own + flag::kRsEnter, e}}));
    for (int t = 0; t < nb && t < numTasks; ++t) TIDE_CHECK(P.push(t, side));
    for (int t = 0; t < numTasks; ++t) {
      TIDE_CHECK(P.reduceAndPut(t, stream));
      TIDE_CHECK(P.finish(t, stream));
      if (t + nb < numTasks) TIDE_CHECK(P.push(t + nb, side));
    }
    TIDE_CHECK(enqueueFlagOps(side, {FlagOp{FlagOp::kWrite, own + flag::kRsPushDone, e}}));
    TIDE_CHECK(enqueueFlagOps(stream, {FlagOp{FlagOp::kWait, own + flag::kRsPushDone, e}}));
  }
  TIDE_TRACE("Cuda", "RS rank %d (node %d of %d, rail %d) epoch %u: %d chunks x %d nodes = %d tasks of %" PRIu64
             " elements%s", me, n, N, q, e, c.numChunks, N, numTasks, c.chunk,
             pp->defersPushes() ? " (deferred, internal stream)" : "");
  return tideSuccess;
}

}  // namespace cuda
}  // namespace tide
