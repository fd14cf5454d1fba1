package gate

import (
	"errors"
	"slices"

	"github.com/go-sql-driver/mysql"

	"github.com/sluicehq/sluice/gate/store"
)

// serverErr reports whether err is a MySQL server error with one of the given numbers.
func serverErr(err error, numbers ...uint16) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && slices.Contains(numbers, me.Number)
}

// lockBusy reports whether a lock taken without waiting was held by another transaction.
func lockBusy(err error) bool { return serverErr(err, 1205) }

// syntaxError reports a statement the server does not understand (1064), such as MariaDB's
// SET STATEMENT sent to MySQL.
func syntaxError(err error) bool { return serverErr(err, 1064) }

// retryable reports whether a transaction failed for contention (deadlock, lock wait timeout,
// or on a Galera cluster a certification conflict, which reports a deadlock), or across a change
// of the id step (store.ErrIDStepChanged), and may be retried as a whole.
func retryable(err error) bool {
	return serverErr(err, 1213, 1205) || errors.Is(err, store.ErrIDStepChanged)
}
