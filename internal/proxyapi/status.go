package proxyapi

import "time"

// Status is what the proxy answers on GET /status.
type Status struct {
	Version uint64    `json:"version"` // of the configuration in force; 0: none yet
	Listen  string    `json:"listen,omitempty"`
	Started time.Time `json:"started"`
	PID     int       `json:"pid"`

	ActiveConnections int64  `json:"activeConnections"`
	Connections       uint64 `json:"connections"`       // accepted since start
	OriginalDstErrors uint64 `json:"originalDstErrors"` // accepted connections closed without a destination
	Requests          uint64 `json:"requests"`
	FlowsDropped      uint64 `json:"flowsDropped"` // flow records slow readers of /flows missed

	// ConfigErrors counts pushes refused (invalid, stale) and configurations
	// that could not be served or saved; LastConfigError says the last one.
	ConfigErrors    uint64 `json:"configErrors"`
	LastConfigError string `json:"lastConfigError,omitempty"`
}
