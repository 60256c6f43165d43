# backend/: the contract between the front end (src/) and the backends (ref/, gpu/): the validated problem
# descriptions and the backend table every op runs through.
noinst_HEADERS += backend/moe_backend.h backend/moe_activations.h
