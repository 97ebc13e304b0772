// The GPU runtime's names, once for CUDA and HIP: a runtime-neutral source says gpuMemcpyAsync,
// gpuStream_t, gpuHostRegister, ... and is compiled once per runtime, with TIER_HAVE_CUDA or
// TIER_HAVE_HIP set by the build (the runtime's target, tier_gpu_runtime in gpu/CMakeLists.txt).
// A name is CUDA's with the prefix `gpu`, mapped to cuda* or hip* by TIER_GPU_PASTE; the few that
// HIP spells otherwise (hipHostMalloc for cudaHostAlloc) are listed apart. Only the names Tierd
// uses are here. What differs in more than a name (CUDA's stream memory operations through the
// driver API, HIP's missing VMM import) is in small files of its own: gpu/runtime_cuda.cc and
// gpu/runtime_hip.cc, engine/cuda_engine.cc and engine/hip_engine.cc, client/gpu/client_gpu_cuda.cc
// and client/gpu/client_gpu_hip.cc.
#ifndef TIER_GPU_RUNTIME_NAMES_H_
#define TIER_GPU_RUNTIME_NAMES_H_

#if defined(TIER_HAVE_CUDA) == defined(TIER_HAVE_HIP)
#error "gpu/runtime_names.h needs exactly one of TIER_HAVE_CUDA and TIER_HAVE_HIP"
#endif

#if defined(TIER_HAVE_CUDA)
#include <cuda_runtime_api.h>
#define TIER_GPU_PASTE(name) cuda##name
// For messages: the runtime's name in tierd's options and logs, in prose, its driver, and the
// variable that picks the GPUs a process sees.
#define TIER_GPU_NAME "cuda"
#define TIER_GPU_TITLE "CUDA"
#define TIER_GPU_DRIVER "CUDA driver"
#define TIER_GPU_VISIBLE_DEVICES "CUDA_VISIBLE_DEVICES"
// Names HIP spells otherwise.
#define gpuErrorMapBufferObjectFailed cudaErrorMapBufferObjectFailed
#define gpuErrorMemoryAllocation cudaErrorMemoryAllocation
#define gpuHostAlloc cudaHostAlloc
#define TIER_GPU_HOST_ALLOC_NAME "cudaHostAlloc"
#define gpuHostAllocPortable cudaHostAllocPortable
#define gpuHostAllocMapped cudaHostAllocMapped
#define gpuFreeHost cudaFreeHost
using gpuPointerAttributes = cudaPointerAttributes;
#else
#include <hip/hip_runtime_api.h>
#define TIER_GPU_PASTE(name) hip##name
#define TIER_GPU_NAME "hip"
#define TIER_GPU_TITLE "HIP"
#define TIER_GPU_DRIVER "ROCm driver"
#define TIER_GPU_VISIBLE_DEVICES "HIP_VISIBLE_DEVICES"
#define gpuErrorMapBufferObjectFailed hipErrorMapFailed
#define gpuErrorMemoryAllocation hipErrorOutOfMemory
#define gpuHostAlloc hipHostMalloc
#define TIER_GPU_HOST_ALLOC_NAME "hipHostMalloc"
#define gpuHostAllocPortable hipHostMallocPortable
#define gpuHostAllocMapped hipHostMallocMapped
#define gpuFreeHost hipHostFree
using gpuPointerAttributes = hipPointerAttribute_t;
#endif

// A runtime function's name as a string, for messages: TIER_GPU_FN(SetDevice) is "cudaSetDevice"
// or "hipSetDevice".
#define TIER_GPU_FN(name) TIER_GPU_NAME #name

using gpuError_t = TIER_GPU_PASTE(Error_t);
using gpuStream_t = TIER_GPU_PASTE(Stream_t);
using gpuEvent_t = TIER_GPU_PASTE(Event_t);
using gpuIpcMemHandle_t = TIER_GPU_PASTE(IpcMemHandle_t);

#define gpuSuccess TIER_GPU_PASTE(Success)
#define gpuErrorNotReady TIER_GPU_PASTE(ErrorNotReady)
#define gpuErrorInvalidValue TIER_GPU_PASTE(ErrorInvalidValue)
#define gpuErrorInvalidDevicePointer TIER_GPU_PASTE(ErrorInvalidDevicePointer)
#define gpuErrorInvalidResourceHandle TIER_GPU_PASTE(ErrorInvalidResourceHandle)
#define gpuErrorNoDevice TIER_GPU_PASTE(ErrorNoDevice)
#define gpuErrorInsufficientDriver TIER_GPU_PASTE(ErrorInsufficientDriver)
#define gpuErrorNotSupported TIER_GPU_PASTE(ErrorNotSupported)

#define gpuStreamNonBlocking TIER_GPU_PASTE(StreamNonBlocking)
#define gpuEventDisableTiming TIER_GPU_PASTE(EventDisableTiming)
#define gpuMemcpyDefault TIER_GPU_PASTE(MemcpyDefault)
#define gpuHostRegisterPortable TIER_GPU_PASTE(HostRegisterPortable)
#define gpuHostRegisterMapped TIER_GPU_PASTE(HostRegisterMapped)
#define gpuIpcMemLazyEnablePeerAccess TIER_GPU_PASTE(IpcMemLazyEnablePeerAccess)

#define gpuGetErrorName TIER_GPU_PASTE(GetErrorName)
#define gpuGetErrorString TIER_GPU_PASTE(GetErrorString)
#define gpuGetLastError TIER_GPU_PASTE(GetLastError)
#define gpuGetDeviceCount TIER_GPU_PASTE(GetDeviceCount)
#define gpuGetDevice TIER_GPU_PASTE(GetDevice)
#define gpuSetDevice TIER_GPU_PASTE(SetDevice)
#define gpuFree TIER_GPU_PASTE(Free)
#define gpuDeviceGetPCIBusId TIER_GPU_PASTE(DeviceGetPCIBusId)
#define gpuDeviceGetStreamPriorityRange TIER_GPU_PASTE(DeviceGetStreamPriorityRange)
#define gpuMemGetInfo TIER_GPU_PASTE(MemGetInfo)
#define gpuStreamCreateWithFlags TIER_GPU_PASTE(StreamCreateWithFlags)
#define gpuStreamCreateWithPriority TIER_GPU_PASTE(StreamCreateWithPriority)
#define gpuStreamDestroy TIER_GPU_PASTE(StreamDestroy)
#define gpuStreamQuery TIER_GPU_PASTE(StreamQuery)
#define gpuStreamSynchronize TIER_GPU_PASTE(StreamSynchronize)
#define gpuStreamWaitEvent TIER_GPU_PASTE(StreamWaitEvent)
#define gpuEventCreateWithFlags TIER_GPU_PASTE(EventCreateWithFlags)
#define gpuEventDestroy TIER_GPU_PASTE(EventDestroy)
#define gpuEventRecord TIER_GPU_PASTE(EventRecord)
#define gpuMemcpyAsync TIER_GPU_PASTE(MemcpyAsync)
#define gpuHostGetDevicePointer TIER_GPU_PASTE(HostGetDevicePointer)
#define gpuPointerGetAttributes TIER_GPU_PASTE(PointerGetAttributes)
#define gpuHostRegister TIER_GPU_PASTE(HostRegister)
#define gpuHostUnregister TIER_GPU_PASTE(HostUnregister)
#define gpuIpcGetMemHandle TIER_GPU_PASTE(IpcGetMemHandle)
#define gpuIpcOpenMemHandle TIER_GPU_PASTE(IpcOpenMemHandle)
#define gpuIpcCloseMemHandle TIER_GPU_PASTE(IpcCloseMemHandle)

#endif  // TIER_GPU_RUNTIME_NAMES_H_
