"""Kernel admission: no fast path runs before it proved itself on this CPU.

A fast path (:class:`~.paths.KernelPath`: an attention backend's code path, or a family of
the decoder's other ops) is probed by :func:`~.admission.admit` in a child process
(:mod:`.child`) on the model's shapes (:class:`~.shapes.ProbeShapes`) against a float64
reference (:mod:`.probe_attention`, :mod:`.probe_ops`); SIGILL, an abort, a hang or wrong
numbers become a refusal with the reason. Verdicts are cached (:mod:`.store`) by CPU flags,
torch version, library contents, probe code, dtype and shapes. The selection that uses them
is :func:`hermes_async.model.attention.select_backend`; ``hermes-async kernels`` prints them.
"""
