"""Weight quantization: int8 weights (and later int4 and GGUF's blocks) for the CPU's linears.

:mod:`.weights` holds a quantized weight (:class:`QuantizedWeight`: integers, scales, the
layout its kernel reads) and the reference arithmetic; :mod:`.apply` quantizes a loaded model's
linears at start-up (``model.quantization``) and reports the bytes before and after.
"""
