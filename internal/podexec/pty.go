package podexec

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// OpenPTY opens a new pseudo-terminal: its controlling side, kept by the
// caller, and its terminal, given to the process (kubectl exec -t).
func OpenPTY() (control, term *os.File, err error) {
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("opening a pseudo-terminal (/dev/ptmx): %w", err)
	}
	control = os.NewFile(uintptr(fd), "/dev/ptmx")
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		control.Close()
		return nil, nil, fmt.Errorf("unlocking the pseudo-terminal: %w", err)
	}
	n, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	if err != nil {
		control.Close()
		return nil, nil, fmt.Errorf("naming the pseudo-terminal: %w", err)
	}
	name := "/dev/pts/" + strconv.Itoa(int(n))
	term, err = os.OpenFile(name, os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		control.Close()
		return nil, nil, fmt.Errorf("opening %s: %w", name, err)
	}
	return control, term, nil
}

// Resize sets the terminal's size, as the client's terminal has it.
func Resize(control *os.File, width, height uint16) error {
	return unix.IoctlSetWinsize(int(control.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Col: width, Row: height})
}
