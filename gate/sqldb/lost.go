package sqldb

import (
	"context"
	"database/sql/driver"
	"errors"
	"net"
	"slices"

	"github.com/go-sql-driver/mysql"
)

// ConnectionLost reports whether err means the database could not be reached or the connection
// broke, as opposed to the server refusing a statement. After a failed COMMIT it means the
// transaction's outcome is unknown.
func ConnectionLost(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) ||
		errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return true
	}
	// too many connections, shutdown, killed, gone away
	var me *mysql.MySQLError
	return errors.As(err, &me) && slices.Contains([]uint16{1040, 1053, 1927, 2002, 2003, 2006, 2013}, me.Number)
}
