package kubecluster

import (
	"fmt"
	"io"
	"net"
	"net/url"

	"github.com/shuntnet/shunt/internal/netnsrun"
)

// RelayInto makes the API server reachable from the network namespace at
// netnsPath, whose loopback is its own: it listens there on the address
// the API server has on this process's loopback and carries each
// connection over, so the cluster's kubeconfigs work unchanged inside (a
// node of a test or benchmark whose host side is a namespace). Traffic
// stays on the two loopbacks. Close stops it.
func (c *Cluster) RelayInto(netnsPath string) (io.Closer, error) {
	u, err := url.Parse(c.Server)
	if err != nil {
		return nil, fmt.Errorf("API server URL %q: %w", c.Server, err)
	}
	addr := u.Host
	var ln net.Listener
	if err := netnsrun.Do(netnsPath, func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		return nil, fmt.Errorf("API server relay in %s: %w", netnsPath, err)
	}
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer in.Close()
				// Dialled from a thread of this process's namespace: the
				// API server's loopback.
				out, err := net.Dial("tcp", addr)
				if err != nil {
					return
				}
				defer out.Close()
				go func() { io.Copy(out, in); out.(*net.TCPConn).CloseWrite() }()
				io.Copy(in, out)
			}()
		}
	}()
	return ln, nil
}
