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
	/* SO_MARK of the node proxy's upstream sockets: the bits under
	 * proxy_mark_mask equal to proxy_mark_magic say "the proxy", the bits
	 * outside the mask carry the identity of the client the connection is
	 * made for. Socket hooks never redirect such sockets; the tc programs
	 * judge their packets as that client. A zero mask disables both. */
	__u32 proxy_mark_magic;
	__u32 proxy_mark_mask;
	/* The node's collect-metadata VXLAN device, through which packets for
	 * pods of other nodes leave (lib/encap.h); 0: no overlay, they go to
	 * the host stack. */
	__u32 tunnel_ifindex;
	/* Native routing (no encapsulation): the node's underlay interface,
	 * out of which packets for pods of other nodes leave as they are, to
	 * the next hop the node's routes give (the agent installs one per
	 * other node's pod CIDR; lib/native.h), and on which other nodes'
	 * pods' packets arrive (bpf/uplink_tc.c). 0: off. Never set with
	 * tunnel_ifindex. */
	__u32 native_ifindex;
	/* 1: every connection enters shunt_ct at its first packet, as before
	 * shunt_ct_new existed, so a flood of new connections evicts
	 * established ones: the baseline benchmarks measure against. */
	__u32 ct_single_table;
	/* The node's address on the pod network (network byte order): pods'
	 * gateway, and so the source of the ICMP errors the programs answer
	 * themselves, as the host stack would (lib/icmp.h). Set whenever
	 * tunnel_ifindex is. */
	__u32 node_ip4;
	/* Traffic from outside to the node's Services (NodePort, externalIPs,
	 * load balancer addresses; lib/nodeport.h): the node's uplink, out of
	 * which the replies of such flows leave (0: off, none is translated),
	 * the address the flows whose backend is on another node get as their
	 * source (externalTrafficPolicy Cluster: the node's address on the pod
	 * network, which every node's ipcache knows as this node's), and the
	 * source ports allocated for them (host byte order, inclusive). */
	__u32 uplink_ifindex;
	__u32 nodeport_snat_ip4;
	__u16 nodeport_port_min;
	__u16 nodeport_port_max;
	/* Steering to the node proxy in tc (lib/steer.h): a new connection
	 * from off the node (another node's pod, outside through a NodePort)
	 * to a local pod's port the node proxy takes (shunt_l7_redirect) is
	 * given to the proxy's transparent listener at proxy_steer_ip4 and
	 * proxy_steer_port (network byte order) with bpf_sk_assign, and
	 * marked proxy_steer_mark, which the node's routing rule delivers
	 * locally. Port 0: no steering; such connections are dropped
	 * (proxy-steer-failed), never passed around the proxy. */
	__u32 proxy_steer_ip4;
	__u16 proxy_steer_port;
	__u16 pad_steer;
	__u32 proxy_steer_mark;
	/* DSR (direct server return, lib/dsr.h): the node's underlay address
	 * (network byte order), the outer source of the IPIP packets that carry
	 * a flow from outside to its backend's node and the only outer
	 * destination this node accepts them at (0: DSR off both ways), and
	 * which new flows to a backend on another node go by DSR rather than
	 * SNAT (enum nodeport_mode). */
	__u32 nodeport_dsr_ip4;
	__u32 nodeport_mode;
	/* The overlay's endpoint on this node (with tunnel_ifindex): the
	 * node's underlay address and the VXLAN device's UDP port (network
	 * byte order). What arrives there is the device's: the uplink program
	 * hands it to the stack at its first look (0: it looks further). */
	__u32 tunnel_local_ip4;
	__u16 tunnel_port;
	__u16 pad_tunnel;
	/* The underlay interface, which holds tunnel_local_ip4: packets for
	 * other nodes' pods are encapsulated in BPF and leave out of it
	 * (lib/encap.h: encap_in_bpf). 0: the VXLAN device encapsulates
	 * them. */
	__u32 tunnel_uplink_ifindex;
};

/* How a flow from outside reaches a backend on another node
 * (shunt_config.nodeport_mode, shuntd --nodeport-mode). */
enum nodeport_mode {
	NODEPORT_MODE_SNAT = 0,   /* from the node's address; the reply comes back through it */
	NODEPORT_MODE_DSR = 1,    /* IPIP to the backend's node with the client's address kept; the reply leaves from there */
	NODEPORT_MODE_HYBRID = 2, /* DSR for TCP, SNAT for UDP */
};

/* A local pod endpoint, keyed by its IPv4 address (network byte order). */
struct endpoint_key {
	__u32 ip4;
};

enum endpoint_flags {
	ENDPOINT_F_INGRESS_ISOLATED = 1, /* some policy isolates the pod for ingress: default deny */
	ENDPOINT_F_EGRESS_ISOLATED = 2,  /* some policy isolates the pod for egress: default deny */
	ENDPOINT_F_INGRESS_RULES = 4,    /* the pod has ingress entries (e.g. denies) to look up */
	ENDPOINT_F_EGRESS_RULES = 8,     /* the pod has egress entries to look up */
	ENDPOINT_F_OWN_PROXY = 16,       /* the pod has its own inbound proxy (shunt.io/inbound-redirect): its
					  * answers to clients from off the node may need their port back
					  * (lib/steer.h, pod_proxy_out) */
};

struct endpoint_info {
	__u32 ifindex;     /* host-side veth of the pod */
	__u32 flags;       /* enum endpoint_flags */
	__u8 pod_mac[6];   /* MAC of the pod's eth0 */
	__u8 node_mac[6];  /* MAC of the host-side veth (the pod's gateway) */
	__u32 identity;    /* the pod's security identity */
	__u32 pad;
	__u64 netns_cookie; /* the pod's network namespace: socket acceleration keys its sockets by it */
};

/*
 * Identities. A pod's identity stands for its (namespace, namespace labels,
 * pod labels): pods with the same labels share it, and policy names
 * identities, never addresses. Reserved identities stand for what is not a
 * pod; CIDR identities stand for the prefixes that policies name, so
 * ipBlock rules match any address in them, pods included.
 */
enum shunt_identity {
	SHUNT_ID_ANY = 0,        /* in policy keys: any peer */
	SHUNT_ID_HOST = 1,       /* the node's own addresses */
	SHUNT_ID_WORLD = 2,      /* anything the ipcache does not know */
	SHUNT_ID_REMOTE_NODE = 6, /* another node of the cluster: its own traffic through the overlay */
	SHUNT_ID_FIRST_POD = 256,
	SHUNT_ID_FIRST_CIDR = 16777216, /* 1 << 24 */
};

/* The TCP option in which the node proxy's SYN to another node's pod
 * carries its client's identity with native routing, where no VNI does
 * (lib/carried_identity.h): an experimental option (RFC 6994: kind 253 and
 * a 16-bit ExID, here "SH"), then the identity, 4 bytes in network order. */
enum shunt_tcp_option {
	SHUNT_TCPOPT_IDENTITY_KIND = 253,
	SHUNT_TCPOPT_IDENTITY_LEN = 8,
	SHUNT_TCPOPT_IDENTITY_EXID = 0x5348,
};

/* The option as it is written: kind, length, ExID, identity. */
struct identity_tcp_option {
	__u8 kind;
	__u8 len;
	__u16 exid;     /* network byte order */
	__u32 identity; /* network byte order */
} __attribute__((packed));

_Static_assert(sizeof(struct identity_tcp_option) == SHUNT_TCPOPT_IDENTITY_LEN, "the identity option's size");

/* shunt_ipcache and shunt_cidr_identities are LPM tries: address/prefix ->
 * identity. The first holds pods and node addresses, and for pods of other
 * nodes the node that hosts them (the tunnel endpoint); the second the
 * prefixes policies name (ipBlock cidr and except). */
struct ipcache_key {
	__u32 prefixlen; /* LPM: bits of ip4 that count */
	__u32 ip4;       /* network byte order */
};

struct ipcache_value {
	__u32 identity;
	/* shunt_ipcache: the underlay IPv4 of the node hosting the address
	 * (network byte order), where packets to it are encapsulated to and
	 * the only outer source accepted for packets from it (overlay), or,
	 * with native routing, the mark of another node's pod: routed out of
	 * the underlay, and judged on arrival by this entry's identity; 0 when
	 * it is on no other node (local pods, node addresses, world). */
	__u32 tunnel_ip4;
};

/*
 * Policy: one LPM trie for every local pod and both directions, keyed by
 * (pod address, peer identity, direction, protocol, destination port).
 * Everything up to the direction is always matched in full; a wildcard
 * protocol stops the prefix before proto, a port range is one or more port
 * prefixes. The program looks up the peer's identity, its CIDR identity and
 * SHUNT_ID_ANY; a deny from any of them wins over an allow.
 */
#define POLICY_PREFIX_FIXED 72 /* endpoint + identity + egress, in bits */
#define POLICY_PREFIX_PROTO 80 /* ... + proto; add 0..16 port bits */

struct policy_key {
	__u32 prefixlen;
	__u32 endpoint;  /* the local pod's IPv4, network byte order */
	__u32 identity;  /* the peer, or SHUNT_ID_ANY */
	__u8 egress;     /* 0: ingress, 1: egress */
	__u8 proto;      /* 0 with prefix POLICY_PREFIX_FIXED: any protocol */
	__u16 dport;     /* network byte order */
};

enum policy_verdict {
	POLICY_NONE = 0,  /* no rule matched (never stored) */
	POLICY_ALLOW = 1,
	POLICY_DENY = 2,
};

struct policy_value {
	__u8 verdict;     /* enum policy_verdict */
	__u8 pad;
	__u16 proxy_port; /* reserved for L7 redirection */
	__u32 rule_id;    /* the rule that decided, named by the agent */
};

/*
 * Connection tracking: one entry per connection, keyed by its tuple with
 * the lower (address, port) end first so both directions find the same
 * entry with one lookup. Created when policy admits a connection's first
 * packet, in shunt_ct_new, and moved to shunt_ct once the connection is
 * assured (lib/conntrack.h); later packets of either direction, and ICMP
 * errors about it, pass without policy lookups.
 */
struct ct_key {
	__u32 addr_a; /* network byte order; (addr_a, port_a) <= (addr_b, port_b) */
	__u32 addr_b;
	__u16 port_a; /* ICMP echo: the identifier on both sides */
	__u16 port_b;
	__u8 proto;
	__u8 pad[3];
};

enum ct_flags {
	CT_F_ORIG_IS_A = 1, /* the connection was opened from the a end */
	CT_F_REPLY_SEEN = 2,
	CT_F_FIN_A = 4,     /* a sent FIN */
	CT_F_FIN_B = 8,
	CT_F_RST = 16,
	/* The node proxy's connection to a local pod made from its client's
	 * address (original source, for a client tc steered to it): the pod's
	 * packets, addressed to the client, go to the proxy's socket
	 * (lib/steer.h, steer_proxy_reply), not where the address routes. */
	CT_F_PROXY_UPSTREAM = 32,
	/* The tc service translation (lib/tc_nat.h) left the connection's
	 * first packet alone at shunt_from_pod (a pod's connection to a pod
	 * or an address, not to a service frontend) or where another node's
	 * packets arrive (the overlay, native routing's uplink), or the
	 * connection was recorded by shunt_to_pod (the node's, or its
	 * proxy's, to a pod).
	 * The pod's packets of it skip the translation's lookups (they would
	 * miss): conntrack keeps a connection's translation decision, as the
	 * kernel's NAT does, so a Service created later for its address and
	 * port leaves it alone. */
	CT_F_NO_TC_NAT = 64,
	/* Recorded from an answer: a TCP segment of a connection no table
	 * held (its entry flushed, evicted or lost), which policy refused its
	 * own way and admitted as the answer of a connection its destination
	 * opened (lib/policy.h, policy_admit_found); that end is recorded as
	 * the opener, and a reply as seen. */
	CT_F_ANSWER = 128,
};

struct ct_value {
	__u64 last_seen_ns; /* bpf_ktime_get_ns of the last refresh */
	__u64 created_ns;
	__u32 flags;        /* enum ct_flags */
	__u32 rule_id;      /* the ingress or egress rule that admitted it (0: not isolated) */
};

/* Why a packet (tc programs) or a socket operation (socket hooks) took the
 * path it did. Counted per (reason, direction) in shunt_metrics, named in flow
 * events, printed by name by the CLI (internal/datapath/enums.go names every
 * value; a value without a name fails the build). Append only: the pinned
 * counters are indexed by these numbers and outlive the agent. */
enum shunt_reason {
	SHUNT_REASON_FORWARDED = 0,       /* redirected to a local pod, or (native routing) out of the underlay
					   * to the node hosting the destination */
	SHUNT_REASON_TO_STACK = 1,        /* handed to the host stack (not a local pod) */
	SHUNT_REASON_NOT_IPV4 = 2,        /* passed: ARP, IPv6, ... */
	SHUNT_REASON_INVALID_PACKET = 3,  /* dropped: truncated or malformed header */
	SHUNT_REASON_TTL_EXCEEDED = 4,    /* passed to the stack so it can answer ICMP */
	SHUNT_REASON_REDIRECT_FAILED = 5, /* dropped: redirect helper returned an error */
	SHUNT_REASON_SERVICE_NO_BACKEND = 6, /* dropped: service without endpoints (tc path) */
	SHUNT_REASON_SERVICE_XLATE = 7,   /* tc path: translated to a backend or back */
	SHUNT_REASON_POLICY_DENIED = 8,   /* dropped: a deny rule matched */
	SHUNT_REASON_POLICY_NOT_ALLOWED = 9, /* dropped: isolated and no rule allows it */
	SHUNT_REASON_CT_FULL = 10,        /* dropped: the conntrack insert failed (policy fails closed) */
	SHUNT_REASON_SPOOFED = 11,        /* dropped: source is not the sending pod's address */
	SHUNT_REASON_NAT_INSERT_FAILED = 12, /* dropped: the tc path could not record a flow's translation */
	SHUNT_REASON_AFFINITY_INSERT_FAILED = 13, /* translated, but the ClientIP affinity entry could not be recorded */
	SHUNT_REASON_SOCK_XLATE = 14,     /* socket hook: a service destination rewritten to a backend */
	SHUNT_REASON_SOCK_REFUSED = 15,   /* socket hook: service without backends, ECONNREFUSED */
	SHUNT_REASON_SOCK_PASSED = 16,    /* socket hook: no service (or no backend of one): left alone */
	SHUNT_REASON_SOCK_RESTORED = 17,  /* recvmsg/getpeername: a backend address given back as its service */
	SHUNT_REASON_REVNAT_INSERT_FAILED = 18, /* the UDP reverse-NAT entry could not be recorded (ENOBUFS when
						 * nothing else can restore the service address of replies) */
	SHUNT_REASON_SOCK_STORAGE_FAILED = 19, /* connect: the socket's translation record could not be created
						* (getpeername shows the backend; UDP replies use the reverse-NAT map) */
	SHUNT_REASON_SOCK_TO_PROXY = 20,  /* connect: sent to an L7 proxy (an L7 rule or route names the destination) */
	SHUNT_REASON_PROXY_ADMITTED = 21, /* tc: a connection to the node proxy the socket hook sent there; its upstream
					   * leg is judged by policy as this client */
	SHUNT_REASON_PROXY_ORIGIN_FAILED = 22, /* the original destination of a proxied connection could not be
						* recorded: the connect fails (ENOBUFS) or the proxy closes it */
	SHUNT_REASON_PROXY_ORIGIN_ANSWERED = 23, /* getsockopt(SO_ORIGINAL_DST) answered for a proxy */
	SHUNT_REASON_ACCEL_ADDED = 24,    /* sockops: an established local connection's socket joined the sockhash */
	SHUNT_REASON_ACCEL_INSERT_FAILED = 25, /* sockops: the sockhash insert failed; the socket keeps the stack */
	SHUNT_REASON_ACCEL_REDIRECTED = 26, /* sk_msg: a send moved straight to the peer's ingress queue */
	SHUNT_REASON_ACCEL_PASSED = 27,   /* sk_msg: the peer is not in the sockhash, the send takes the stack */
	SHUNT_REASON_ACCEL_ENDED = 28,    /* sockops: an accelerated socket closed (left the sockhash) */
	SHUNT_REASON_ACCEL_FOREIGN_NETNS = 29, /* sockops: a socket uses a pod's address outside the pod's namespace: not accelerated */
	SHUNT_REASON_SOCK_FOREIGN_NETNS = 30, /* socket hooks: a socket of a namespace this node does not manage (not the node's, no pod's): left alone */
	SHUNT_REASON_TO_TUNNEL = 31,      /* encapsulated to the node hosting the destination (overlay) */
	SHUNT_REASON_TUNNEL_SPOOFED = 32, /* dropped: an overlay packet whose outer source is not the node hosting its
					   * inner source address, or whose VNI is no pod identity */
	SHUNT_REASON_TUNNEL_KEY_FAILED = 33, /* dropped: the tunnel key could not be set or read (a helper failed, or
					      * the sender's identity does not fit a VNI) */
	SHUNT_REASON_CT_PROMOTE_FAILED = 34, /* an assured connection could not move from shunt_ct_new to shunt_ct:
					      * it stays where a flood of new connections can evict it (its packet passes) */
	SHUNT_REASON_FIB_LOOKUP_FAILED = 35, /* native routing: the route lookup for a pod of another node found
					      * no route out of the underlay (none, unreachable, packet over the
					      * MTU, ...): handed to the host stack, which answers (ICMP) or drops */
	SHUNT_REASON_MASQUERADED = 36,    /* uplink egress: a pod's packet for outside the cluster leaves from the node's address */
	SHUNT_REASON_MASQ_PORT_EXHAUSTED = 37, /* dropped: no free masquerade port for the destination within the tries */
	SHUNT_REASON_MASQ_INSERT_FAILED = 38, /* dropped: the masquerade translation could not be recorded in shunt_masq_nat */
	SHUNT_REASON_UNMASQUERADED = 39,  /* uplink ingress: a reply (or an ICMP error about) a masqueraded flow, given back to its pod */
	SHUNT_REASON_ARP_SPOOFED = 40,    /* dropped: an ARP frame from a pod claiming an address that is not the pod's
					   * (lib/arp.h) */
	SHUNT_REASON_FRAG_NEEDED = 41,    /* answered with ICMP fragmentation needed: the packet does not fit the
					   * tunnel (DF set; a GSO packet: its segments do not), so it is not sent
					   * (lib/encap.h), or DSR's room (lib/dsr.h); or a router's fragmentation
					   * needed about a DSR packet between the nodes, sent on to the client with
					   * the MTU less DSR's header (dsr_path_error) */
	SHUNT_REASON_PROXY_IDENTITY = 42, /* the node proxy's connection to another node's pod: the VNI carries the
					   * identity of the client the proxy acts for (its socket mark), not the
					   * remote-node identity of the node's other traffic */
	SHUNT_REASON_ACCEL_CONGESTED = 43, /* sk_msg: the peer socket's unread queue is full (its receive buffer,
					    * at least 4 MiB): this socket's sends take the stack from now on,
					    * which holds a writer back as TCP does (bpf/lib/accel_peer.h);
					    * counted once per socket */
	SHUNT_REASON_NODEPORT_XLATE = 44, /* uplink ingress: a packet from outside to a NodePort, externalIP or load
					   * balancer address translated to a backend (lib/nodeport.h) */
	SHUNT_REASON_NODEPORT_REPLY = 45, /* a backend's reply to such a flow: the Service's address given back as
					   * its source, and sent out of the uplink to the client */
	SHUNT_REASON_LB_SOURCE_DENIED = 46, /* dropped: a new flow from outside to a load balancer address whose
					     * Service's loadBalancerSourceRanges do not hold the client
					     * (lib/source_ranges.h); at the socket layer, a node-local
					     * client's connect or sendmsg refused (ECONNREFUSED) */
	SHUNT_REASON_PROXY_STEERED = 47, /* tc: a packet from off the node for a local pod's port with HTTP rules
					  * given to the node proxy's socket (bpf_sk_assign, lib/steer.h) */
	SHUNT_REASON_PROXY_STEER_FAILED = 48, /* dropped: a new connection from off the node to a local pod's port
					       * with HTTP rules, which could not be given to the node proxy (no
					       * steering configured, its listener missing, the assign failed):
					       * never passed around the proxy */
	SHUNT_REASON_DSR_ENCAP = 49, /* uplink ingress: a flow from outside sent to its backend's node by DSR: IPIP
				      * with the service address and port in an IP option, the client's address kept
				      * (lib/dsr.h) */
	SHUNT_REASON_DSR_DECAP = 50, /* uplink ingress: such a packet arrived at the backend's node, decapsulated and
				      * recorded, so the backend's reply leaves from here with the service address
				      * (or an ICMP error from outside about a reply, translated for the backend) */
	SHUNT_REASON_DSR_TOO_BIG = 51, /* dropped: a packet for DSR that would not fit the uplink's MTU once
					* encapsulated (with the overlay: or the pods' MTU, the tunnel device's)
					* and has no DF bit (with DF it is answered, frag-needed) */
	SHUNT_REASON_DSR_GSO_DECAP = 52, /* dropped: a GSO packet arrived by DSR on a kernel before Linux 6.3,
					  * whose bpf_skb_adjust_room cannot take its IPIP header off
					  * (BPF_F_ADJ_ROOM_DECAP_L3_IPV4; kernel fallback dsr-no-gso-decap) */
	SHUNT_REASON_PROXY_UPSTREAM_REPLY = 53, /* pod veth: a local pod's packet on a connection the node proxy made
						 * from its client's address (original source) given to the proxy's
						 * socket (bpf_sk_assign, lib/steer.h), not routed to that address */
	SHUNT_REASON_DSR_UNKNOWN_NODE = 54, /* dropped: an IPIP packet in DSR's format for this node whose outer
					     * source is no node of the cluster (shunt_dsr_nodes): only nodes
					     * may hand a backend a client's packet (lib/dsr.h) */
	SHUNT_REASON_NAT_ENTRY_LOST = 55, /* counted: a flow's NAT entry written a moment before was gone when
					   * checked (the LRU evicted it to make room for the flow's other
					   * entry, lib/lru.h): written again, so its reply is still translated */
	SHUNT_REASON_NODEPORT_ENTRY_MISSING = 56, /* counted: a TCP segment other than a first SYN came from outside
						   * to a NodePort, load balancer or external address for a flow
						   * this node holds no entry of (nor the kernel's conntrack): its
						   * entry was evicted from a full table (raise --conntrack-max), or
						   * the flow is unknown (a scan). Taken as a new flow, as before */
	SHUNT_REASON_ACCEL_UNTRACKED = 57, /* sk_msg: an accelerated socket's connection has no conntrack entry any
					    * more (flushed, evicted, expired while idle): its sends take the stack
					    * from now on, where tc judges them as any connection whose entry was
					    * lost; counted once per socket */
	SHUNT_REASON_IDENTITY_CARRIED = 58, /* native routing: the node proxy's SYN to another node's pod carries
					     * its client's identity in a TCP option (sockops, counted at connect),
					     * and a SYN from another node's address with that option is judged
					     * as that identity (counted at from-uplink; lib/carried_identity.h) */
	SHUNT_REASON_MAX,
};

/* Where an outcome is counted: a direction of the tc programs on a pod veth
 * or on the overlay device, or the socket hook (its v4 and v6 programs
 * together). */
enum shunt_direction {
	SHUNT_DIR_FROM_POD = 0,
	SHUNT_DIR_TO_POD = 1,
	SHUNT_DIR_CONNECT = 2,
	SHUNT_DIR_SENDMSG = 3,
	SHUNT_DIR_RECVMSG = 4,
	SHUNT_DIR_GETPEERNAME = 5,
	SHUNT_DIR_GETSOCKOPT = 6, /* a proxy's getsockopt(SO_ORIGINAL_DST) */
	SHUNT_DIR_SOCKMSG = 7,    /* socket acceleration: sockops and sk_msg */
	SHUNT_DIR_FROM_OVERLAY = 8, /* tc ingress of the node's VXLAN device: what other nodes' pods send */
	SHUNT_DIR_TO_UPLINK = 9,    /* tc egress of the node's uplink: what leaves the node (masquerade) */
	SHUNT_DIR_FROM_UPLINK = 10, /* tc ingress of the node's uplink: replies to masqueraded flows, other nodes' pods (native routing) */
	SHUNT_DIR_TO_OVERLAY = 11,  /* tc egress of the node's VXLAN device: the node's own traffic to other nodes' pods */
	SHUNT_DIR_MAX,
};

/* shunt_metrics is a per-CPU array indexed by
 * reason * SHUNT_METRICS_DIRECTIONS + direction. It has room for more
 * reasons and directions than exist, so adding one keeps the pinned map, and
 * its counts, compatible. Raising one of these changes the map's size: the
 * agent then replaces a pinned map of the old size (replaceOldCounters in
 * internal/datapath), and the counts start again from zero. */
enum shunt_metrics_layout {
	SHUNT_METRICS_REASONS = 64,
	SHUNT_METRICS_DIRECTIONS = 16,
};
_Static_assert(SHUNT_REASON_MAX <= SHUNT_METRICS_REASONS, "shunt_metrics: raise SHUNT_METRICS_REASONS");
_Static_assert(SHUNT_DIR_MAX <= SHUNT_METRICS_DIRECTIONS, "shunt_metrics: raise SHUNT_METRICS_DIRECTIONS");

struct metrics_value {
	__u64 packets; /* socket hooks: calls */
	__u64 bytes;   /* 0 for socket hooks */
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
	SERVICE_F_EXTERNAL = 2, /* reached from outside the cluster (NodePort, externalIP, load balancer): the
				 * uplink program translates packets to it */
	SERVICE_F_LOCAL = 4,    /* externalTrafficPolicy Local: this node's backends only, the client's address kept */
	/* The Service's forwarding mode (annotation shunt.io/forwarding-mode)
	 * for flows to a backend on another node, over the node's
	 * nodeport_mode; neither: the node's mode (lib/dsr.h dsr_wanted). */
	SERVICE_F_FWD_SNAT = 8,
	SERVICE_F_FWD_DSR = 16,
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

/* Who a ClientIP affinity entry is for (affinity_key.client_kind): the
 * socket layer knows a client by its network namespace (one pod = one
 * netns), the uplink and tc by its address. A kind of its own each, so a
 * netns cookie and an address of equal value never share an entry. */
enum affinity_client_kind {
	AFFINITY_CLIENT_NETNS = 0, /* client_cookie is a network namespace cookie */
	AFFINITY_CLIENT_ADDR = 1,  /* client_cookie is an IPv4 address (network byte order) */
};

/* ClientIP affinity: per client and frontend (service id). */
struct affinity_key {
	__u64 client_cookie;
	__u32 service_id;
	__u32 client_kind; /* enum affinity_client_kind (was padding: 0, a netns cookie) */
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

/* shunt_nodeport_nat: the translation of a flow from outside to one of the
 * node's external Service addresses (lib/nodeport.h), keyed by a tuple as
 * it arrives (struct tc_nat_key), naming the whole tuple to write over
 * it. Two entries per flow: the client's packets (to the frontend) become
 * the client's, or with SNAT the node's, to the backend; the backend's
 * replies become the frontend's to the client. */
struct nodeport_nat_value {
	__u32 saddr;  /* network byte order */
	__u32 daddr;
	__u16 sport;  /* network byte order */
	__u16 dport;
	__u8 reply;   /* 1: a backend's reply, sent out of the uplink */
	__u8 dsr;     /* 1: the client's entry of a DSR flow on its ingress node (lib/dsr.h): no reply
		       * entry here, the reply leaves from the backend's node */
	__u8 dsr_in;  /* 1: an entry (either) of a flow that arrived by DSR, on the backend's node: the
		       * backend's SYN-ACK gets an MSS that leaves room for DSR's outer header
		       * (dsr_clamp_mss) */
	__u8 pad;
	/* Both entries of a flow are refreshed together; an entry idle past
	 * its timeout (lib/nat_timeout.h) no longer holds its SNAT port. */
	__u64 last_seen_ns;
	__u32 flags;  /* enum masq_flags: the client's FIN is "out", the backend's "in" */
	__u32 pad2;
};

/*
 * Masquerade: pods' traffic to destinations outside the cluster leaves
 * the node's uplink from the node's address (bpf/uplink_tc.c). One LRU
 * table holds both directions of every translated flow: the original
 * tuple as the pod sent it (MASQ_OUT) names the node's address and the
 * port allocated; the reply tuple as it comes back (MASQ_IN: outside ->
 * node address, port) names the pod's address and port. Each entry keeps
 * its own idle time and TCP state (no dependence on shunt_ct's layout):
 * an entry idle past its timeout is free, and its port with it.
 */
enum masq_dir {
	MASQ_OUT = 0, /* key: pod -> outside, as sent; value: the node's address and allocated port */
	MASQ_IN = 1,  /* key: outside -> node address and allocated port; value: the pod's address and port */
};

struct masq_key {
	__u32 saddr;  /* network byte order */
	__u32 daddr;
	__u16 sport;  /* network byte order; ICMP echo: the identifier on both sides */
	__u16 dport;
	__u8 proto;
	__u8 dir;     /* enum masq_dir */
	__u16 pad;
};

enum masq_flags {
	MASQ_F_REPLY_SEEN = 1, /* a packet came back (TCP: no longer only opening) */
	MASQ_F_FIN_OUT = 2,    /* the pod sent FIN */
	MASQ_F_FIN_IN = 4,     /* the outside sent FIN */
	MASQ_F_RST = 8,
};

struct masq_value {
	__u64 last_seen_ns; /* bpf_ktime_get_ns of the last refresh (both entries of a flow are refreshed together) */
	__u64 created_ns;
	__u32 addr;         /* network byte order: the address written in place of the original */
	__u16 port;         /* network byte order */
	__u16 pad;
	__u32 flags;        /* enum masq_flags, the same in both entries of a flow */
	__u32 pad2;
};

/* Load-time configuration of the uplink programs. */
struct masq_config {
	__u32 addr;     /* the node's address pods' traffic leaves from (network byte order); 0: off */
	__u16 port_min; /* allocated source ports (host byte order), inclusive */
	__u16 port_max;
};

/* shunt_masq_exclude: destinations never masqueraded (LPM trie, keyed by
 * struct ipcache_key): the cluster's pods, services and nodes. Any
 * address the ipcache knows (pods, node addresses) is never masqueraded
 * either. */
struct masq_exclude_value {
	__u32 reserved; /* presence is what counts */
};

/*
 * Flow events, sent to the agent through the shunt_flows ring buffer. What is
 * sent depends on shunt_flow_config: drops, connection starts and ends and
 * service translations by default, every packet when tracing, nothing when
 * off. A full ring buffer never blocks a packet: the event is counted lost.
 */
enum flow_mode {
	FLOW_MODE_OFF = 0,
	FLOW_MODE_DEFAULT = 1, /* drops, connection start/end, translations, ICMP errors about connections */
	FLOW_MODE_ALL = 2,     /* every packet */
};

struct flow_config {
	__u32 mode; /* enum flow_mode */
	__u32 pad;
};

enum flow_verdict {
	FLOW_FORWARDED = 0,  /* delivered (to a pod, or to the host stack) */
	FLOW_DROPPED = 1,    /* a packet dropped, or a socket operation refused */
	FLOW_TRANSLATED = 2, /* a socket's service destination rewritten to a backend */
	FLOW_REDIRECTED_PROXY = 3,
	FLOW_VERDICT_MAX,
};

enum flow_event_type {
	FLOW_EV_PACKET = 0,    /* a packet (tracing every packet) */
	FLOW_EV_CONN_NEW = 1,  /* first packet of a new connection */
	FLOW_EV_CONN_END = 2,  /* TCP FIN or RST */
	FLOW_EV_DROP = 3,
	FLOW_EV_SOCK = 4,      /* a socket hook's decision (connect, sendmsg) */
	FLOW_EV_CONN_ANSWER = 5, /* first packet of a connection whose entry was
				  * lost, sent by its destination: the answer of a
				  * connection opened the other way (CT_F_ANSWER) */
	FLOW_EV_ICMP_ERROR = 6,  /* an ICMP error about a tracked connection; its
				  * tcp_flags hold the error (enum flow_icmp_error) */
	FLOW_EV_MAX,
};

/* An ICMP error event's type and code, in the byte of flow_event that TCP
 * flags take (an ICMP packet has none): the kind in bits 7-6, the code in
 * bits 3-0 (destination unreachable's go up to 15). */
enum flow_icmp_error {
	FLOW_ICMP_DEST_UNREACH = 0x40,
	FLOW_ICMP_TIME_EXCEEDED = 0x80,
	FLOW_ICMP_PARAMETER_PROBLEM = 0xc0,
	FLOW_ICMP_KIND_MASK = 0xc0,
	FLOW_ICMP_CODE_MASK = 0x0f,
};

enum flow_point {
	FLOW_POINT_FROM_POD = 0, /* tc ingress of the pod's host veth */
	FLOW_POINT_TO_POD = 1,   /* tc egress of the pod's host veth */
	FLOW_POINT_SOCK = 2,     /* cgroup socket hook */
	FLOW_POINT_FROM_OVERLAY = 3, /* tc ingress of the node's VXLAN device */
	FLOW_POINT_TO_UPLINK = 4,    /* tc egress of the node's uplink (masquerade) */
	FLOW_POINT_FROM_UPLINK = 5,  /* tc ingress of the node's uplink */
	FLOW_POINT_MAX,
};

struct flow_event {
	__u64 ts_ns;        /* bpf_ktime_get_ns (CLOCK_MONOTONIC) */
	__u64 cgroup_id;    /* socket hooks: the caller's cgroup */
	__u32 saddr;        /* network byte order; after translation */
	__u32 daddr;
	__u32 orig_daddr;   /* service address before translation, 0 if none */
	__u16 sport;        /* network byte order */
	__u16 dport;
	__u16 orig_dport;
	__u8 proto;
	__u8 tcp_flags;
	__u8 verdict;       /* enum flow_verdict */
	__u8 reason;        /* enum shunt_reason: the outcome, or a record that could not be made */
	__u8 point;         /* enum flow_point */
	__u8 event;         /* enum flow_event_type */
	__u32 ifindex;
	__u32 src_identity;
	__u32 dst_identity;
	__u32 rule_id;      /* the policy rule that decided, 0 if none */
	__u32 len;          /* packet length; an accelerated socket's end: its sends through the redirect */
	__u64 bytes;        /* an accelerated socket's end: bytes it sent through the redirect */
};

struct flow_stats {
	__u64 emitted;
	__u64 lost; /* the ring buffer was full */
};

/* Per-socket record of a connect-time translation (TCP, connected UDP). */
struct sock_translation {
	__u32 vip;
	__u32 backend_ip;
	__u16 vport;
	__u16 backend_port;
};

/*
 * L7 redirection. A connect() to a destination in shunt_l7_redirect (a
 * service VIP:port with an HTTPRoute, a pod port with HTTP policy rules, or
 * a pod port whose own proxy asked for it) goes to the proxy the entry
 * names instead. The original destination is kept with the socket and,
 * once the kernel has picked the source port (sockops, TCP_CONNECT_CB),
 * filed in shunt_proxy_origins under the tuple the proxy will see, where
 * the proxy's getsockopt(SOL_IP, SO_ORIGINAL_DST) finds it.
 */
struct l7_redirect_key {
	__u32 ip;   /* network byte order */
	__u16 port; /* network byte order */
	__u8 proto; /* IPPROTO_TCP */
	__u8 pad;
};

struct l7_redirect_value {
	__u32 proxy_ip;   /* network byte order */
	__u16 proxy_port; /* network byte order */
	__u16 pad;
};

/* The original destination of a redirected socket (its socket storage). */
struct proxy_origin {
	__u32 ip;   /* network byte order */
	__u16 port; /* network byte order */
	__u16 flags; /* enum proxy_origin_flags */
};

enum proxy_origin_flags {
	/* Filed by tc for a client from off the node sent to a pod's own
	 * proxy (lib/steer.h, pod_proxy_in): the client's packets get the
	 * proxy's port as destination, the pod's answers the dialled port back
	 * as source. Without it: a socket hook redirected the client's
	 * connect, and its packets carry the proxy's port themselves. */
	PROXY_ORIGIN_F_TC = 1,
};

/* A redirected connection as the proxy's accepted socket sees it. */
struct proxy_origin_key {
	__u32 client_ip;   /* network byte order */
	__u32 proxy_ip;
	__u16 client_port; /* network byte order */
	__u16 proxy_port;
};

/* What tc needs to judge a proxy upstream connection as its client: a
 * local endpoint with that identity (pods with one identity have the same
 * policy), keyed by identity. */
struct identity_endpoint {
	__u32 ip;    /* network byte order */
	__u32 flags; /* enum endpoint_flags */
};

/*
 * Socket acceleration. sockops puts both ends of an established TCP
 * connection between local endpoints (pods of this node, the node proxy,
 * optionally the node's own processes) into shunt_sockhash, once tc has
 * admitted the connection (its conntrack entry exists); sk_msg then moves
 * each send into the peer socket's ingress queue. A socket is keyed by its
 * own tuple (local end first) and its network namespace's cookie: every pod
 * has the same loopback addresses, so a tuple alone would splice one pod's
 * loopback connection into another's.
 */
struct sock_key {
	__u64 netns_cookie; /* the socket's network namespace (bpf_get_netns_cookie) */
	__u32 local_ip;     /* network byte order */
	__u32 remote_ip;
	__u16 local_port;   /* network byte order */
	__u16 remote_port;
	__u32 pad;
};

enum accel_sock_flags {
	ACCEL_SOCK_F_LOOPBACK = 1, /* inside one namespace: no conntrack entry to keep fresh */
	ACCEL_SOCK_F_ACTIVE = 2,   /* the connecting end */
	ACCEL_SOCK_F_CONGESTED = 4, /* its peer's queue filled once: its sends take the stack for good */
	ACCEL_SOCK_F_UNTRACKED = 8, /* its conntrack entry was gone once: its sends take the stack for good */
};

/* Socket storage of an accelerated socket: the key of its peer, found once
 * at sockops, and what its sends moved through the redirect, reported when
 * it closes. */
struct accel_sock {
	struct sock_key peer;
	__u64 started_ns; /* bpf_ktime_get_ns when it joined the sockhash */
	__u64 bytes;      /* sent through the redirect */
	__u64 msgs;       /* sends (sk_msg calls) through the redirect */
	__u32 flags;      /* enum accel_sock_flags */
	__u32 pad;
};

struct accel_config {
	__u32 enabled;        /* 0: no new socket joins the sockhash */
	__u32 node_processes; /* 1: the node's own processes too (host namespace), not only pods and the node proxy */
	__u64 host_netns_cookie; /* the node's network namespace */
};

/* Destroying sockets of backends that went away (bpf/sock_destroy.c). */

/* A backend that went away: sockets connected to it through a service are
 * destroyed. Key of shunt_gone_backends. */
struct gone_backend {
	__u32 ip;   /* network byte order */
	__u16 port; /* network byte order */
	__u8 proto; /* IPPROTO_UDP (the only iterator so far) */
	__u8 pad;
};

/* One record per socket the iterator tried to destroy, written to the
 * iterator's output (bpf_seq_write): the agent counts them per call and per
 * network namespace, with no shared counter to reset or race on. */
struct destroy_result {
	__u64 cookie; /* socket cookie (SO_COOKIE) */
	__s32 err;    /* bpf_sock_destroy's return: 0, or a negative errno */
	__u32 pad;
};

/* shunt_lb_source_ranges: the clients a load balancer frontend admits
 * (loadBalancerSourceRanges; lib/source_ranges.h). An LPM trie keyed by
 * the frontend's service id (slot 0's id in shunt_services) then the
 * client's address: prefixlen counts the id's 32 bits too. A frontend
 * with ranges has one entry per range (allow = 1) and one with the id
 * alone (prefixlen 32, allow = 0) that every other client matches; a
 * frontend without ranges has none, and admits everyone. */
struct lb_source_range_key {
	__u32 prefixlen;  /* 32 + the range's bits */
	__u32 service_id; /* big endian, as the trie compares bytes from the first */
	__u32 addr;       /* network byte order */
};

struct lb_source_range_value {
	__u8 allow; /* 1: a range of the frontend holds the client; 0: the frontend's catch-all */
	__u8 pad[3];
};

/* shunt_dsr_nodes: the underlay addresses of the cluster's other nodes,
 * the only outer sources a node takes DSR's IPIP from (lib/dsr.h). A hash
 * map the agent writes from the Node objects (their InternalIP, else
 * ExternalIP: the addresses other nodes' pods are reached at). */
struct dsr_node_key {
	__u32 addr; /* network byte order */
};

struct dsr_node_value {
	__u32 reserved; /* presence is what counts */
};

#endif /* SHUNT_H */
