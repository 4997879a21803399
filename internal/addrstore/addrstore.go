// Package addrstore keeps the node's pod address reservations on disk, one
// file per address, as the reference host-local IPAM plugin does: the file
// is named after the address and holds the container ID and interface that
// own it.
//
// Why on disk and not in the agent: every CNI command is its own process,
// and a runtime runs them concurrently. A lock file (flock) serialises
// "find the lowest free address, reserve it" across those processes, and
// the reservation itself is an O_EXCL create, so two ADDs can never get the
// same address even from a process that ignores the lock. DEL frees the
// address without the agent, so an agent that is down or restarting never
// leaks or double-books an address, and reservations outlive both the
// plugin and the agent. The choice of address stays the pure
// internal/ipam.Pool's (lowest free, never the node's own).
package addrstore

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shuntnet/shunt/internal/ipam"
)

// Reservation is one address held by one attachment.
type Reservation struct {
	IP          netip.Addr
	ContainerID string
	IfName      string
}

// Store is the reservations of one network in one directory.
type Store struct {
	dir string
}

// Open returns the store of network under dataDir, creating its directory.
func Open(dataDir, network string) (*Store, error) {
	dir := filepath.Join(dataDir, network)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the address store %s: %w", dir, err)
	}
	return &Store{dir: dir}, nil
}

// Dir is where the reservations live.
func (s *Store) Dir() string { return s.dir }

// locked runs fn holding the store's lock, which serialises every plugin
// process working on this network.
func (s *Store) locked(fn func() error) error {
	f, err := os.OpenFile(filepath.Join(s.dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("opening the address store's lock: %w", err)
	}
	defer f.Close() // closing releases the lock
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("locking the address store %s: %w", s.dir, err)
	}
	return fn()
}

// Allocate reserves the lowest free address of pool for the attachment, or
// returns the one it holds already (a retried ADD gets the same address).
func (s *Store) Allocate(pool ipam.Pool, containerID, ifName string) (netip.Addr, error) {
	var ip netip.Addr
	err := s.locked(func() error {
		all, err := s.list()
		if err != nil {
			return err
		}
		inUse := map[netip.Addr]bool{}
		for _, r := range all {
			if r.ContainerID == containerID && r.IfName == ifName && pool.Contains(r.IP) {
				ip = r.IP
				return nil
			}
			inUse[r.IP] = true
		}
		for {
			if ip, err = pool.Allocate(inUse); err != nil {
				return err
			}
			f, err := os.OpenFile(filepath.Join(s.dir, ip.String()), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if errors.Is(err, os.ErrExist) {
				inUse[ip] = true // reserved behind the lock's back: take the next
				continue
			}
			if err != nil {
				return fmt.Errorf("reserving %s: %w", ip, err)
			}
			_, werr := f.WriteString(containerID + "\n" + ifName)
			if err := errors.Join(werr, f.Close()); err != nil {
				os.Remove(f.Name())
				return fmt.Errorf("reserving %s: %w", ip, err)
			}
			return nil
		}
	})
	return ip, err
}

// Get returns the address the attachment holds, if any.
func (s *Store) Get(containerID, ifName string) (netip.Addr, bool, error) {
	var ip netip.Addr
	err := s.locked(func() error {
		all, err := s.list()
		for _, r := range all {
			if r.ContainerID == containerID && r.IfName == ifName {
				ip = r.IP
			}
		}
		return err
	})
	return ip, ip.IsValid(), err
}

// Release frees what the attachment holds; nothing held is not an error.
func (s *Store) Release(containerID, ifName string) error {
	return s.locked(func() error {
		all, err := s.list()
		if err != nil {
			return err
		}
		for _, r := range all {
			if r.ContainerID == containerID && r.IfName == ifName {
				if err := os.Remove(filepath.Join(s.dir, r.IP.String())); err != nil && !errors.Is(err, os.ErrNotExist) {
					return fmt.Errorf("freeing %s: %w", r.IP, err)
				}
			}
		}
		return nil
	})
}

// Retain frees every reservation keep says no to and returns them.
func (s *Store) Retain(keep func(Reservation) bool) ([]Reservation, error) {
	var freed []Reservation
	err := s.locked(func() error {
		all, err := s.list()
		if err != nil {
			return err
		}
		var errs []error
		for _, r := range all {
			if keep(r) {
				continue
			}
			if err := os.Remove(filepath.Join(s.dir, r.IP.String())); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("freeing %s: %w", r.IP, err))
				continue
			}
			freed = append(freed, r)
		}
		return errors.Join(errs...)
	})
	return freed, err
}

// List returns every reservation.
func (s *Store) List() ([]Reservation, error) {
	var all []Reservation
	err := s.locked(func() (err error) {
		all, err = s.list()
		return err
	})
	return all, err
}

func (s *Store) list() ([]Reservation, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("reading the address store %s: %w", s.dir, err)
	}
	var out []Reservation
	for _, e := range entries {
		ip, err := netip.ParseAddr(e.Name())
		if err != nil {
			continue // the lock file, or something not ours
		}
		data, err := os.ReadFile(filepath.Join(s.dir, e.Name()))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading reservation %s: %w", ip, err)
		}
		id, ifName, _ := strings.Cut(string(data), "\n")
		out = append(out, Reservation{IP: ip, ContainerID: strings.TrimSpace(id), IfName: strings.TrimSpace(ifName)})
	}
	return out, nil
}
