/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The fixed-width types of the kernel UAPI, for the BPF target only. The
 * system's <linux/types.h> pulls in <asm/types.h> from an architecture
 * directory (and glibc's headers after it), which is what made the build
 * depend on the host's libc; these are the same types from clang's builtin
 * macros, nothing else. Shared by the vendored linux/bpf.h and shunt's own
 * headers.
 */
#ifndef _LINUX_TYPES_H
#define _LINUX_TYPES_H

typedef __signed__ char __s8;
typedef unsigned char __u8;
typedef __signed__ short __s16;
typedef unsigned short __u16;
typedef __signed__ int __s32;
typedef unsigned int __u32;
typedef __signed__ long long __s64;
typedef unsigned long long __u64;

/* Byte-order annotations: plain integers for the compiler, documentation
 * for the reader (network byte order is big endian). */
typedef __u16 __le16;
typedef __u16 __be16;
typedef __u32 __le32;
typedef __u32 __be32;
typedef __u64 __le64;
typedef __u64 __be64;
typedef __u16 __sum16;
typedef __u32 __wsum;

#define __aligned_u64 __u64 __attribute__((aligned(8)))
#define __aligned_be64 __be64 __attribute__((aligned(8)))
#define __aligned_le64 __le64 __attribute__((aligned(8)))

typedef unsigned int __poll_t;

#endif /* _LINUX_TYPES_H */
