/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Every map key/value struct, the load-time configuration and the drop/verdict
 * reasons shared between the BPF programs and the Go agent. This header is the
 * single definition: bpf2go generates the Go types from it (-type flags in
 * internal/datapath/generate.go), so never hand-copy a layout into Go.
 */
#ifndef SHUNT_H
#define SHUNT_H

#include <linux/types.h>

/* Forwarding modes chosen when the lab node is created. "bridge" and
 * "routed" attach no BPF program at all; they exist as baselines. */
enum shunt_fwd_mode {
	SHUNT_FWD_REDIRECT_PEER = 0, /* bpf_redirect_peer: straight into the peer netns */
	SHUNT_FWD_REDIRECT = 1,      /* bpf_redirect: out of the host veth, via the peer's backlog */
};

/* Load-time configuration, set from Go with spec.Variables before loading so
 * the verifier prunes the branches a mode does not use. */
struct shunt_config {
	enum shunt_fwd_mode fwd_mode;
	__u32 pad;
};

/* A local pod endpoint, keyed by its IPv4 address (network byte order). */
struct endpoint_key {
	__u32 ip4;
};

struct endpoint_info {
	__u32 ifindex;     /* host-side veth of the pod */
	__u32 flags;       /* reserved */
	__u8 pod_mac[6];   /* MAC of the pod's eth0 */
	__u8 node_mac[6];  /* MAC of the host-side veth (the pod's gateway) */
};

/* Why a packet took the path it did. Counted per (reason, direction) and
 * printed by name by the CLI (internal/datapath/reasons.go mirrors the names). */
enum shunt_reason {
	SHUNT_REASON_FORWARDED = 0,       /* redirected to a local pod */
	SHUNT_REASON_TO_STACK = 1,        /* handed to the host stack (not a local pod) */
	SHUNT_REASON_NOT_IPV4 = 2,        /* passed: ARP, IPv6, ... */
	SHUNT_REASON_INVALID_PACKET = 3,  /* dropped: truncated or malformed header */
	SHUNT_REASON_TTL_EXCEEDED = 4,    /* passed to the stack so it can answer ICMP */
	SHUNT_REASON_REDIRECT_FAILED = 5, /* dropped: redirect helper returned an error */
	SHUNT_REASON_SERVICE_NO_BACKEND = 6, /* dropped: service without endpoints (tc path) */
	SHUNT_REASON_SERVICE_XLATE = 7,   /* tc path: translated to a backend or back */
	SHUNT_REASON_MAX,
};

enum shunt_direction {
	SHUNT_DIR_FROM_POD = 0,
	SHUNT_DIR_TO_POD = 1,
	SHUNT_DIR_MAX,
};

/* shunt_metrics is a per-CPU array indexed by reason * SHUNT_DIR_MAX + direction. */
struct metrics_value {
	__u64 packets;
	__u64 bytes;
};

/*
 * Services. A service port is a set of entries in shunt_services keyed by
 * (VIP, port, protocol, slot): slot 0 is the service itself, slots
 * 1..backend_count name its backends. The agent writes new slots before the
 * slot-0 entry that makes them visible, and deletes old slots only after it,
 * so a lookup never finds a service without backends it could use.
 */
struct service_key {
	__u32 vip;      /* network byte order */
	__u16 port;     /* network byte order */
	__u8 proto;     /* IPPROTO_TCP / IPPROTO_UDP */
	__u8 pad;
	__u16 slot;     /* 0: the service; 1..n: backend slots */
	__u16 pad2;
};

enum service_flags {
	SERVICE_F_AFFINITY = 1, /* ClientIP session affinity */
};

struct service_value {
	__u32 id;               /* slot 0: service id; slot n: backend id */
	__u16 backend_count;    /* slot 0: active backends (0: refuse) */
	__u16 flags;            /* enum service_flags */
	__u32 affinity_timeout; /* seconds */
	__u32 pad;
};

struct backend_value {
	__u32 ip;   /* network byte order */
	__u16 port; /* network byte order */
	__u8 proto;
	__u8 pad;
};

/* ClientIP affinity. At the socket layer the client is identified by its
 * network namespace (one pod = one netns): the netns cookie. */
struct affinity_key {
	__u64 client_cookie;
	__u32 service_id;
	__u32 pad;
};

struct affinity_value {
	__u64 last_used_ns;
	__u32 backend_id;
	__u32 pad;
};

/* Reverse translation for UDP replies and getpeername: which service a
 * socket reached when it talked to a backend. Keyed by netns cookie, socket
 * cookie and backend, so sockets in different pods never collide and one
 * unconnected socket can talk to several services at once. */
struct revnat_key {
	__u64 netns_cookie;
	__u64 sock_cookie;
	__u32 backend_ip;
	__u16 backend_port;
	__u16 pad;
};

struct revnat_value {
	__u32 vip;
	__u16 vport;
	__u16 pad;
};

/* Per-flow translation of the tc fallback, for packets no hooked socket
 * translated. Two entries per flow: the original direction (client -> VIP)
 * names the backend, the reply direction (backend -> client) names the VIP. */
struct tc_nat_key {
	__u32 saddr;
	__u32 daddr;
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 pad[3];
};

struct tc_nat_value {
	__u32 addr;  /* the address (and port) to write in place of the original */
	__u16 port;
	__u8 reply;  /* 1: rewrite the source (reply direction), 0: the destination */
	__u8 pad;
};

/* Per-socket record of a connect-time translation (TCP, connected UDP). */
struct sock_translation {
	__u32 vip;
	__u32 backend_ip;
	__u16 vport;
	__u16 backend_port;
};

#endif /* SHUNT_H */
