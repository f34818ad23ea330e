"""The `dm` backend: the kernel's own dm-log-writes target on this host (harness/backends/dm/).

pc-dmlog.c is the one implementation of the target's life (create, mark,
remove, the mark file); the vm backend's guest runs the same program.
"""
