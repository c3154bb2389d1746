"""SGLang's HiCache (host tier L2, storage tier L3) for K3 on the k3_cpu platform (either model).

`transfer_ops` holds torch versions of the host<->device copies SGLang takes from CUDA kernels; `hooks` is the
general plugin that supplies them and passes HiCache's CUDA-only steps on a CPU host (entry point
`k3_hicache_cpu`)."""
