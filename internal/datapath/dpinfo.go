package datapath

import "github.com/shuntnet/shunt/internal/dpinfo"

// Types of internal/dpinfo under the names they had here: Row, which the
// dumps of this package build by the dozen, and PortRange, the type of the
// agent's Config.MasqueradePorts. New code says dpinfo.
type (
	Row       = dpinfo.Row
	PortRange = dpinfo.PortRange
)
