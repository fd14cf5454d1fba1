package gate

import (
	"context"
	"database/sql/driver"
	"errors"
	"net"

	"github.com/go-sql-driver/mysql"
)

// connectionLost reports whether err means the database could not be reached or the connection
// broke, as opposed to the server refusing a statement.
func connectionLost(err error) bool {
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
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case 1040, 1053, 1927, 2002, 2003, 2006, 2013: // too many connections, shutdown, killed, gone away
			return true
		}
	}
	return false
}

// lockBusy reports whether a lock taken without waiting was held by another transaction.
func lockBusy(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1205
}

// syntaxError reports a statement the server does not understand (1064), such as MariaDB's
// SET STATEMENT sent to MySQL.
func syntaxError(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1064
}

// retryable reports whether a transaction failed for contention (deadlock, lock wait timeout)
// and may be retried as a whole.
func retryable(err error) bool {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number == 1213 || me.Number == 1205
	}
	return false
}
