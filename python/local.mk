# python/: the libmoe package for PyTorch (pure Python over ctypes; python/README.md).  `make install` puts
# it in $(pythondir)/libmoe and records $(libdir) in it (_installed.py) so that it finds the installed
# library; from the source tree it finds the build tree's .libs/ (or LIBMOE_PATH).
LIBMOE_PY = python/libmoe/__init__.py python/libmoe/_capi.py python/libmoe/_ops.py python/libmoe/_raw.py \
	python/libmoe/_tensors.py python/libmoe/compat.py python/libmoe/fp8.py python/libmoe/fp8_train.py \
	python/libmoe/gemm.py python/libmoe/layer.py python/libmoe/mlp.py
if HAVE_PYTHON
libmoepydir = $(pythondir)/libmoe
libmoepy_PYTHON = $(LIBMOE_PY)
install-data-hook: install-libmoe-py-libdir
uninstall-hook: uninstall-libmoe-py-libdir
install-libmoe-py-libdir:
	echo 'LIBDIR = "$(libdir)"  # written by make install' > "$(DESTDIR)$(libmoepydir)/_installed.py"
uninstall-libmoe-py-libdir:
	rm -f "$(DESTDIR)$(libmoepydir)/_installed.py"
# installcheck (distcheck runs it): the installed package, imported from outside the source tree, loads the
# installed library.  Skipped without a Python that imports torch, or under DESTDIR (the library is not at
# $(libdir) yet).
installcheck-local:
	@if test -n "$(DESTDIR)"; then echo "installcheck: DESTDIR set, the installed package is not imported"; \
	elif py=`PYTHON="$(PYTHON)" sh $(srcdir)/tests/torch_python.sh`; then \
	  cd / && PYTHONPATH="$(pythondir)" LIBMOE_PATH= "$$py" -c 'import libmoe, sys; p = libmoe.library_path(); \
	    print("installcheck: libmoe from", libmoe.__file__, "loads", p); \
	    sys.exit(0 if p.startswith("$(libdir)/") else "not the installed library")'; \
	else echo "installcheck: no Python imports torch; the installed package is not imported"; fi
else
EXTRA_DIST += $(LIBMOE_PY)
endif
EXTRA_DIST += python/pyproject.toml python/README.md python/tests/test_libmoe.py python/tests/bounds.py \
	bench/python_bench.py bench/python_host.py bench/device-python.sh

# The tests: on CPU tensors, on CUDA tensors (skips without a device), and the struct layouts they compare.
check_PROGRAMS += tests/python_abi
TESTS += tests/test_python.sh tests/test_python_cuda.sh
EXTRA_DIST += tests/test_python.sh tests/test_python_cuda.sh tests/torch_python.sh
# the FP8 calls' tests and their models (python/libmoe/fp8.py)
EXTRA_DIST += python/tests/test_fp8.py python/tests/fp8_model.py python/tests/test_fp8_train.py
