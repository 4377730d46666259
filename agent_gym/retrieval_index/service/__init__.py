"""Any index behind HTTP: ``server`` (`agent-gym index serve`, FastAPI), ``client`` (:class:`RemoteRetriever`),
``replicas`` (one server process per core behind one port), ``search_cache`` (a shared LRU of answers), and the
server's request guards ``http_body_limit`` and ``http_deadline``."""
