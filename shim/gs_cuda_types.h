/* The CUDA driver and NVML types the shim needs, laid out as cuda.h (CUDA 12/13) and nvml.h lay them out, so the
 * shim builds on a machine without the CUDA toolkit. The one declaration: the fake libcuda (fakes/cuda) includes
 * this file too, so the shim and the driver it is tested against cannot disagree on a layout. Structs are
 * declared whole, with _Static_asserts on cuda.h's sizes.
 */
#ifndef GS_CUDA_TYPES_H
#define GS_CUDA_TYPES_H

#include <stddef.h>
#include <stdint.h>

/* --- CUDA driver API ------------------------------------------------------------------------------------ */
typedef int CUresult;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_NOT_PERMITTED 800
#define CUDA_ERROR_NOT_SUPPORTED 801

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned int CUdeviceptr_v1; /* cuMemAlloc / cuMemFree before CUDA 3.2 */
typedef uint64_t cuuint64_t;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUfunc_st *CUfunction;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUctxCreateParams_st CUctxCreateParams;
typedef struct CUexecAffinityParam_st CUexecAffinityParam;
typedef struct CUlaunchAttribute_st CUlaunchAttribute;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef void (*CUhostFn)(void *userData);
typedef struct CUmemAccessDesc_st CUmemAccessDesc;
typedef struct CUmod_st *CUmodule;
typedef struct CUlib_st *CUlibrary;
#define CU_STREAM_CAPTURE_STATUS_NONE 0

typedef struct CUuuid_st {
    char bytes[16];
} CUuuid;

/* cuGetProcAddress flags and status. */
#define CU_GET_PROC_ADDRESS_DEFAULT 0
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM (1 << 0)
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (1 << 1)
typedef int CUdriverProcAddressQueryResult;
#define CU_GET_PROC_ADDRESS_SUCCESS 0
#define CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND 1
#define CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT 2

typedef struct CUlaunchConfig_st {
    unsigned int gridDimX;
    unsigned int gridDimY;
    unsigned int gridDimZ;
    unsigned int blockDimX;
    unsigned int blockDimY;
    unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

#define CU_MEM_LOCATION_TYPE_DEVICE 1
#define CU_MEM_LOCATION_TYPE_HOST 2
typedef struct CUmemLocation_st {
    int type; /* CUmemLocationType */
    int id;
} CUmemLocation;

#define CU_MEM_ALLOCATION_TYPE_PINNED 1
#define CU_MEM_ALLOC_GRANULARITY_MINIMUM 0
#define CU_MEM_ALLOC_GRANULARITY_RECOMMENDED 1
typedef struct CUmemAllocationProp_st {
    int type;                 /* CUmemAllocationType */
    int requestedHandleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct CUmemPoolProps_st {
    int allocType;
    int handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

/* Graph memory nodes (cuGraphAddMemAllocNode; cuGraphAddNode with CU_GRAPH_NODE_TYPE_MEM_ALLOC). */
#define CU_GRAPH_NODE_TYPE_MEM_ALLOC 10
typedef struct CUDA_MEM_ALLOC_NODE_PARAMS_st {
    CUmemPoolProps poolProps;
    const CUmemAccessDesc *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr; /* out */
} CUDA_MEM_ALLOC_NODE_PARAMS;
/* CUgraphNodeParams starts with the node type; the shim reads nothing else of it. */
typedef struct CUgraphNodeParams_st {
    int type; /* CUgraphNodeType */
    int reserved0[3];
    long long reserved1[29];
    long long reserved2;
} CUgraphNodeParams;

/* Arrays (textures and surfaces). Formats: CUarray_format. */
#define CU_AD_FORMAT_UNSIGNED_INT8 0x01
#define CU_AD_FORMAT_UNSIGNED_INT16 0x02
#define CU_AD_FORMAT_UNSIGNED_INT32 0x03
#define CU_AD_FORMAT_SIGNED_INT8 0x08
#define CU_AD_FORMAT_SIGNED_INT16 0x09
#define CU_AD_FORMAT_SIGNED_INT32 0x0a
#define CU_AD_FORMAT_HALF 0x10
#define CU_AD_FORMAT_FLOAT 0x20
typedef struct CUDA_ARRAY_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    int Format; /* CUarray_format */
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;
typedef struct CUDA_ARRAY3D_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    size_t Depth;
    int Format; /* CUarray_format */
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;
/* The CUDA 3.1 descriptors (cuArrayCreate / cuArray3DCreate before _v2): 32-bit sizes. */
typedef struct CUDA_ARRAY_DESCRIPTOR_v1_st {
    unsigned int Width;
    unsigned int Height;
    int Format; /* CUarray_format */
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v1;
typedef struct CUDA_ARRAY3D_DESCRIPTOR_v1_st {
    unsigned int Width;
    unsigned int Height;
    unsigned int Depth;
    int Format; /* CUarray_format */
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v1;

/* Memory shared between processes (cuIpcGetMemHandle / cuIpcOpenMemHandle). */
#define CU_IPC_HANDLE_SIZE 64
typedef struct CUipcMemHandle_st {
    char reserved[CU_IPC_HANDLE_SIZE];
} CUipcMemHandle;

#if defined(__x86_64__) || defined(__aarch64__)
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp as in cuda.h");
_Static_assert(sizeof(CUmemPoolProps) == 88, "CUmemPoolProps as in cuda.h");
_Static_assert(sizeof(CUDA_MEM_ALLOC_NODE_PARAMS) == 120, "CUDA_MEM_ALLOC_NODE_PARAMS as in cuda.h");
_Static_assert(sizeof(CUgraphNodeParams) == 256, "CUgraphNodeParams as in cuda.h");
_Static_assert(sizeof(CUDA_ARRAY_DESCRIPTOR) == 24, "CUDA_ARRAY_DESCRIPTOR as in cuda.h");
_Static_assert(sizeof(CUDA_ARRAY3D_DESCRIPTOR) == 40, "CUDA_ARRAY3D_DESCRIPTOR as in cuda.h");
_Static_assert(sizeof(CUlaunchConfig) == 56, "CUlaunchConfig as in cuda.h");
#endif

#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16

/* --- NVML ------------------------------------------------------------------------------------------------- */
typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NO_PERMISSION 4
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_LIBRARY_NOT_FOUND 12
#define NVML_ERROR_FUNCTION_NOT_FOUND 13
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_UNKNOWN 999

typedef struct nvmlDevice_st *nvmlDevice_t;
#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96

typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct nvmlMemory_v2_st {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef struct nvmlUtilization_st {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

#endif /* GS_CUDA_TYPES_H */
