"""Scale-out on Ray Serve (the ``ray`` extra; nothing outside this package and the CLI's
``serve --replicas`` imports Ray).

- :mod:`~hermes_async.scale.prefix_index`: chained block digests per namespace, the shadow
  index of what each replica caches and its corrections, the ranking with its load margin
  (pure, no Ray).
- :mod:`~hermes_async.scale.messages`: what the ingress, the router and the replicas say to
  each other (``RouteHint``, ``Accepted``/``Refused``, reports).
- :mod:`~hermes_async.scale.router`: the Ray Serve request routers (prefix-aware, and Ray's
  power of two choices for comparison).
- :mod:`~hermes_async.scale.replica`: ``EngineReplica``, one engine per deployment replica.
- :mod:`~hermes_async.scale.remote_engine`: ``RemoteEngine``, the engine API over the
  replicas, which the OpenAI layer serves unchanged.
- :mod:`~hermes_async.scale.merge`: per-replica ``/metrics`` and ``/cache/stats`` into one.
- :mod:`~hermes_async.scale.ingress` and :mod:`~hermes_async.scale.app`: the ASGI ingress
  deployment and the application (``build_app``, ``serve_forever``).
"""
