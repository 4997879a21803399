package dpinfo

// Counter is one (reason, direction) packet/byte counter, summed over CPUs.
// For a socket hook (direction connect, sendmsg, recvmsg or getpeername)
// Packets counts the hook's calls and Bytes stays 0; the tc directions
// (from-pod, to-pod, from-overlay, to-uplink, from-uplink, to-overlay)
// count packets and bytes.
type Counter struct {
	Reason    string `json:"reason"`
	Direction string `json:"direction"`
	Packets   uint64 `json:"packets"`
	Bytes     uint64 `json:"bytes"`
}

// SocketHook says whether the counter is a socket hook's, which counts calls,
// not packets, and no bytes.
func (c Counter) SocketHook() bool {
	for d := range DirMax {
		if d.Packets() && d.String() == c.Direction {
			return false
		}
	}
	return true
}
