package labtools

import (
	"context"
	"fmt"
	"io"
)

// HTTPGet sends one request and writes the response to w as `shunt lab
// http-get` prints it: the status code on a line, then the body as it came.
// Any status is a success (tests check a proxy's 403 and its body); the
// error is for no response, or a body that broke off after the status line.
func HTTPGet(q Request, w io.Writer) error {
	c := q.client(nil)
	defer c.CloseIdleConnections()
	req, err := q.build(context.Background())
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := fmt.Fprintf(w, "%d\n", resp.StatusCode); err != nil {
		return err
	}
	_, err = io.Copy(w, resp.Body)
	return err
}
