# LibTorch: the one inside the PyTorch 2.11 wheel (CUDA 13 + NCCL), for CPU and GPU alike.
#
# Where it comes from, first match wins:
#   1. Torch_DIR or CMAKE_PREFIX_PATH given by the user (a libtorch archive, a conda env);
#   2. the Python environment VLMTRAIN_PYTHON (default: <source>/.venv/bin/python, made by
#      scripts/install-deps.sh; else python3 on PATH): torch.utils.cmake_prefix_path.
# VLMTRAIN_PYTHON is also the interpreter the tests run their references with (HF
# tokenizers, transformers, torchrun); the tests fail, naming it, if it lacks them.
#
# Sets: VLMTRAIN_PYTHON, VLMTRAIN_NCCL_INCLUDE_DIR; target `torch` (from TorchConfig).

if(EXISTS ${PROJECT_SOURCE_DIR}/.venv/bin/python)
  set(_default_python ${PROJECT_SOURCE_DIR}/.venv/bin/python)
else()
  find_program(_default_python NAMES python3 python)
endif()
set(VLMTRAIN_PYTHON "${_default_python}" CACHE FILEPATH
    "Python with torch (and the test references): scripts/install-deps.sh makes .venv/")

if(NOT Torch_DIR AND VLMTRAIN_PYTHON)
  execute_process(
    COMMAND ${VLMTRAIN_PYTHON} -c "import torch, os; print(torch.utils.cmake_prefix_path); print(os.path.dirname(torch.__file__))"
    OUTPUT_VARIABLE _torch_out ERROR_VARIABLE _torch_err RESULT_VARIABLE _torch_rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_torch_rc EQUAL 0)
    string(REPLACE "\n" ";" _torch_out "${_torch_out}")
    list(GET _torch_out 0 _torch_prefix)
    list(APPEND CMAKE_PREFIX_PATH ${_torch_prefix})
  endif()
endif()

# The CUDA kernels are LibTorch's own; vlmtrain compiles no CUDA code. Naming an arch list
# keeps TorchConfig from probing for a GPU that this machine may not have.
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(ENV{TORCH_CUDA_ARCH_LIST} "8.0;9.0")
endif()
find_package(Torch QUIET)
if(NOT Torch_FOUND)
  message(FATAL_ERROR
    "LibTorch not found.\n"
    "  looked in: Torch_DIR='${Torch_DIR}', CMAKE_PREFIX_PATH='${CMAKE_PREFIX_PATH}', "
    "python '${VLMTRAIN_PYTHON}' (import torch: ${_torch_err})\n"
    "  hint: run scripts/install-deps.sh (makes .venv/ with torch==2.11.0 from PyPI), or pass "
    "-DVLMTRAIN_PYTHON=<python with torch> or -DCMAKE_PREFIX_PATH=<libtorch>/share/cmake")
endif()
if(Torch_VERSION VERSION_LESS 2.4)
  message(FATAL_ERROR "LibTorch ${Torch_VERSION} is too old: vlmtrain needs 2.4 or newer "
                      "(tested: 2.11.0). hint: pip install torch==2.11.0")
endif()
if(NOT TARGET torch_cuda)
  message(FATAL_ERROR "LibTorch ${Torch_VERSION} at ${TORCH_INSTALL_PREFIX} was built without "
                      "CUDA: vlmtrain is one binary for CPU and GPU and needs a CUDA + NCCL "
                      "LibTorch (it runs on CPU when no GPU is present). hint: the PyPI wheel "
                      "torch==2.11.0 (CUDA 13.0), or a cu12x/cu13x libtorch archive")
endif()

# ProcessGroupNCCL.hpp includes nccl.h: the nvidia-nccl wheel beside torch, or the CUDA
# toolkit's (CUDAToolkit_INCLUDE_DIRS, /usr/local/cuda/include).
get_filename_component(_nccl_wheel "${TORCH_INSTALL_PREFIX}/../nvidia/nccl/include" ABSOLUTE)
set(_nccl_hints ${_nccl_wheel})
find_path(VLMTRAIN_NCCL_INCLUDE_DIR nccl.h
          HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS} ${CUDA_INCLUDE_DIRS}
                $ENV{NCCL_ROOT}/include /usr/local/cuda/include /usr/include)
if(NOT VLMTRAIN_NCCL_INCLUDE_DIR)
  message(FATAL_ERROR
    "nccl.h not found (LibTorch's ProcessGroupNCCL.hpp includes it).\n"
    "  looked in: ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS} $NCCL_ROOT/include "
    "/usr/local/cuda/include /usr/include\n"
    "  hint: pip install nvidia-nccl-cu13 into the torch environment, install the CUDA "
    "toolkit's NCCL, or pass -DVLMTRAIN_NCCL_INCLUDE_DIR=<dir containing nccl.h>")
endif()
message(STATUS "vlmtrain: LibTorch ${Torch_VERSION} (${TORCH_INSTALL_PREFIX}), "
               "nccl.h in ${VLMTRAIN_NCCL_INCLUDE_DIR}, python ${VLMTRAIN_PYTHON}")
