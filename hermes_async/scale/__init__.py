"""Scale-out across engine replicas (issue 16, in progress): the prefix-cache-aware routing
core (:mod:`hermes_async.scale.prefix_index`), without Ray so far."""
