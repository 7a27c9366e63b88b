# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""One rank's share: on one GPU, exactly what ONE GPU of a W-rank node does during TIDE-AG / TIDE-RS.

Loopback-8 puts all eight ranks' copies through one GPU's HBM, which overstates what one GPU of a node sees. Here
the GPU holds rank 0's real buffers plus pre-staged images of the other ranks' data, and runs rank 0's part only:
* AG: rank 0's own shard into its slot (local copy-engine copy, unpaced) and the W-1 incoming shards into their
  places in rank 0's slot, paced to the link rate;
* RS: per pipeline chunk, the W-1 incoming chunk pushes into rank 0's staging (paced) and rank 0's own push
  (local, unpaced), then rank 0's reduce with the library's own kernel and shape rule (tideBenchReduce), two
  staging buffers as the plan has them, a push into a buffer waiting for the reduce that frees it; each buffer's
  pushes on an incoming stream of their own, so that the link carries chunk k+1 right behind chunk k as the peers'
  pushes would (`rs-share-serial`: every chunk on one stream, which leaves the link idle at each chunk boundary
  while the pacer learns of the next chunk).
--timeline (default 1) prints, per side, where one unit's time went: per chunk the incoming copies, own copies and
reduce (from a profiled unit behind the same gate as the timed ones), the link's gaps and the tail after the last
incoming byte.
Pacing (tideBenchPacedCopy): copies cut into pieces, each gated by a stream wait on a host-memory word that a host
thread releases when the piece's bytes could have crossed a link of --link-gbps (aggregate over the W-1 peers); the
pacer itself runs nothing on the SMs. HBM traffic matches the node: an incoming copy here reads an image and writes
rank 0's buffer (2 bytes of HBM traffic per byte), where on the node the peer's write lands in rank 0's HBM and rank
0's own outgoing pushes read it (also 2 per byte); what is not modelled is the NVLink port itself.

Where the incoming copies run (--incoming-source), as measured on an H200: a same-device copy, even the hinted
cudaMemcpyBatchAsync, runs as an SM kernel and waits behind a kernel that holds every SM (a 256 MiB copy issued
during a full-GPU GEMM ended when the GEMM ended). So with "device" images (the default) the pieces released during
a single-wave GEMM stall until it ends: the GEMM sees almost none of their HBM traffic, which on a node (peer writes
through NVLink, no receiver SM) it would. With "host" images (pinned host memory) the pieces are host-to-device
copies, copy-engine work that runs beside the GEMM as NVLink writes would, costing rank 0 only the HBM write (1 byte
per byte; the outgoing pushes' reads are then not modelled); but they arrive at most at the host link's rate (about
52 GB/s on the H200's PCIe, 7x below 370), so the unit takes far longer than the link floor and the HBM rate beside
the GEMM is that much lower. Neither is a node; the two bracket it: device = right bytes, wrong overlap; host =
right overlap, too few bytes per second. Compare both before trusting a GEMM slowdown below ~1.1x.

Measured, per side work, with the interference method (side streams busy before the GEMM starts and past its end;
median and IQR over --runs >= 31 runs that met it): the single-wave GEMM's slowdown; the side work's time alone (end
to end, against the link-rate floor (W-1)/W x bytes / rate), its modelled HBM bytes/s, and its SM time weighted by
occupancy (sum over kernels of duration x min(1, CTAs / SMs), torch.profiler); the GEMM's kernel, grid and cluster
shape. A run meets the method when the side work outlasted the GEMM, the GEMM was enqueued before the GPU left the
gate (a sleep on a head stream), and the side's stream never ran dry between units. The GEMM is enqueued right after
the first side unit (--order gemm-after-first): a paced Llama-70B share is about 700 stream operations per unit and
the driver queues about 1,020 per stream, so with the GEMM after all K = 3 units (--order side-first) the host blocks
in the side's enqueue, the GEMM goes onto its stream after the GPU has started, and its events time host latency
too (2.3x instead of 1.06x on an H200).
Controls in the same run: GEMM alone (before and after), an NCCL-like persistent reduce of 16 and 32 CTAs paced to
the same link time (tideBenchPersistentReduce), the unpaced share, loopback-8 (upper bound).

Modules: plan (copies, pacing, modelled bytes), method (the method's rules and statistics), gpu, sides, profile,
timeline, harness (GEMM alone and beside the side work), cli (the command line; `python benchmarks/share --help`).
"""
