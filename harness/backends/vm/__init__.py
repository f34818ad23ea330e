"""Running a recording or crash recovery inside a QEMU guest (the `vm` backend).

The guest boots the kernel under test with a small generated initramfs;
dm-log-writes, mkfs, the workload and the recovery mounts run there, while
replay and fsck stay on the host (see docs/vm-backend.md).
"""
