package api

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
)

// The files of a TLS directory, as a Kubernetes TLS Secret mounts them
// (kubernetes.io/tls with the CA beside): the peer's certificate and key,
// and the CA every peer's certificate must be signed by.
const (
	TLSCertFile = "tls.crt"
	TLSKeyFile  = "tls.key"
	TLSCAFile   = "ca.crt"
)

// LoadTLS makes a mutual TLS configuration from dir's certificate, key
// and CA: as a server it asks every client for a certificate the CA signed
// and refuses the others; as a client it presents its own and trusts only
// servers the CA signed, for any name (agents are reached at node
// addresses no certificate names; the CA is the cluster's own, made for
// this alone). The files are checked now and read again at every
// handshake, so certificates replaced in place (a Secret the kubelet
// updates) take over without a restart.
func LoadTLS(dir string, server bool) (*tls.Config, error) {
	if _, _, err := readTLSDir(dir); err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS13}
	if server {
		cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cert, pool, err := readTLSDir(dir)
			if err != nil {
				return nil, err
			}
			return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
				ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}, nil
		}
		return cfg, nil
	}
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		cert, _, err := readTLSDir(dir)
		return &cert, err
	}
	// The chain is checked against the CA below, without the host name.
	cfg.InsecureSkipVerify = true
	cfg.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
		_, pool, err := readTLSDir(dir)
		if err != nil {
			return err
		}
		if len(raw) == 0 {
			return fmt.Errorf("the server sent no certificate")
		}
		leaf, err := x509.ParseCertificate(raw[0])
		if err != nil {
			return err
		}
		inter := x509.NewCertPool()
		for _, r := range raw[1:] {
			if c, err := x509.ParseCertificate(r); err == nil {
				inter.AddCert(c)
			}
		}
		_, err = leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		return err
	}
	return cfg, nil
}

// readTLSDir reads dir's certificate and key, and its CA as a pool.
func readTLSDir(dir string) (tls.Certificate, *x509.CertPool, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, TLSCertFile), filepath.Join(dir, TLSKeyFile))
	if err != nil {
		return cert, nil, fmt.Errorf("TLS directory %s: %w (it needs %s, %s and %s)", dir, err, TLSCertFile, TLSKeyFile, TLSCAFile)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, TLSCAFile))
	if err != nil {
		return cert, nil, fmt.Errorf("TLS directory %s: %w", dir, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return cert, nil, fmt.Errorf("TLS directory %s: %s holds no PEM certificate", dir, TLSCAFile)
	}
	return cert, pool, nil
}

// CheckPlainListen refuses a listen address that is not on loopback when
// no TLS protects it: what a node's flows show (who talks to whom) is for
// whom the cluster's CA vouches, not for whoever reaches the node.
func CheckPlainListen(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("listen address %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("listen address %q is not on loopback: give a TLS directory (ca.crt, tls.crt, tls.key) so only peers with a certificate of the cluster's CA connect", addr)
}
