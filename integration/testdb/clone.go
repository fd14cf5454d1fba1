package testdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// plan is what cloning a database takes, read once from the source (the template, which nothing
// writes to after it is migrated).
type plan struct {
	src      string
	tables   []string // base tables
	seeded   []string // base tables that have rows
	fks      []foreignKey
	triggers []trigger // in creation order: table, event, timing, action order
	views    []view
}

type foreignKey struct {
	name, table, refTable string
	cols, refCols         []string
	onUpdate, onDelete    string
}

type trigger struct {
	name, timing, event, table, orientation, statement, sqlMode string
}

type view struct {
	name, definition, checkOption string
}

// readPlan reads src's base tables, which of them have rows, its foreign keys, triggers and
// views from information_schema.
func readPlan(ctx context.Context, db *sql.DB, src string) (*plan, error) {
	p := &plan{src: src}
	err := queryRows(ctx, db, `SELECT TABLE_NAME FROM information_schema.TABLES
		WHERE TABLE_SCHEMA = ? AND TABLE_TYPE = 'BASE TABLE' ORDER BY TABLE_NAME`, []any{src}, func(rows *sql.Rows) error {
		var t string
		if err := rows.Scan(&t); err != nil {
			return err
		}
		p.tables = append(p.tables, t)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read tables of %s: %w", src, err)
	}
	for _, t := range p.tables {
		var has int
		if err := db.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM "+ident(src, t)+")").Scan(&has); err != nil {
			return nil, fmt.Errorf("read rows of %s.%s: %w", src, t, err)
		}
		if has == 1 {
			p.seeded = append(p.seeded, t)
		}
	}
	byName := map[string]int{} // table and name: index in p.fks
	err = queryRows(ctx, db, `SELECT rc.CONSTRAINT_NAME, rc.TABLE_NAME, rc.REFERENCED_TABLE_NAME, rc.UPDATE_RULE,
			rc.DELETE_RULE, k.COLUMN_NAME, k.REFERENCED_COLUMN_NAME
		FROM information_schema.REFERENTIAL_CONSTRAINTS rc
		JOIN information_schema.KEY_COLUMN_USAGE k ON k.CONSTRAINT_SCHEMA = rc.CONSTRAINT_SCHEMA
			AND k.TABLE_NAME = rc.TABLE_NAME AND k.CONSTRAINT_NAME = rc.CONSTRAINT_NAME
		WHERE rc.CONSTRAINT_SCHEMA = ?
		ORDER BY rc.TABLE_NAME, rc.CONSTRAINT_NAME, k.ORDINAL_POSITION`, []any{src}, func(rows *sql.Rows) error {
		var f foreignKey
		var col, refCol string
		if err := rows.Scan(&f.name, &f.table, &f.refTable, &f.onUpdate, &f.onDelete, &col, &refCol); err != nil {
			return err
		}
		key := f.table + "\x00" + f.name
		i, ok := byName[key]
		if !ok {
			i = len(p.fks)
			byName[key] = i
			p.fks = append(p.fks, f)
		}
		p.fks[i].cols = append(p.fks[i].cols, col)
		p.fks[i].refCols = append(p.fks[i].refCols, refCol)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read foreign keys of %s: %w", src, err)
	}
	err = queryRows(ctx, db, `SELECT TRIGGER_NAME, ACTION_TIMING, EVENT_MANIPULATION, EVENT_OBJECT_TABLE,
			ACTION_ORIENTATION, ACTION_STATEMENT, SQL_MODE
		FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = ?
		ORDER BY EVENT_OBJECT_TABLE, EVENT_MANIPULATION, ACTION_TIMING, ACTION_ORDER`, []any{src}, func(rows *sql.Rows) error {
		var t trigger
		if err := rows.Scan(&t.name, &t.timing, &t.event, &t.table, &t.orientation, &t.statement, &t.sqlMode); err != nil {
			return err
		}
		p.triggers = append(p.triggers, t)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read triggers of %s: %w", src, err)
	}
	err = queryRows(ctx, db, `SELECT TABLE_NAME, VIEW_DEFINITION, CHECK_OPTION FROM information_schema.VIEWS
		WHERE TABLE_SCHEMA = ? ORDER BY TABLE_NAME`, []any{src}, func(rows *sql.Rows) error {
		var v view
		if err := rows.Scan(&v.name, &v.definition, &v.checkOption); err != nil {
			return err
		}
		p.views = append(p.views, v)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read views of %s: %w", src, err)
	}
	return p, nil
}

// clone fills the empty database dst with a copy of the plan's source. Tables, rows, foreign
// keys and the install_id go in one multi-statement round trip: rows are copied before the
// foreign keys exist, so their order does not matter. Triggers and views follow, one statement
// each, triggers under the sql_mode they were created with.
func (p *plan) clone(ctx context.Context, db *sql.DB, dst string) error {
	var b strings.Builder
	for _, t := range p.tables {
		fmt.Fprintf(&b, "CREATE TABLE %s LIKE %s;\n", ident(dst, t), ident(p.src, t))
	}
	for _, t := range p.seeded {
		fmt.Fprintf(&b, "INSERT INTO %s SELECT * FROM %s;\n", ident(dst, t), ident(p.src, t))
	}
	for _, f := range p.fks {
		fmt.Fprintf(&b, "ALTER TABLE %s ADD CONSTRAINT %s FOREIGN KEY (%s) REFERENCES %s (%s) ON DELETE %s ON UPDATE %s;\n",
			ident(dst, f.table), ident(f.name), identList(f.cols), ident(dst, f.refTable), identList(f.refCols),
			f.onDelete, f.onUpdate)
	}
	for _, t := range p.seeded {
		if t == "installation" {
			// install_id is part of every NATS message id: two databases must never share one
			// (0001_init.sql). created_at says when this installation began: now.
			fmt.Fprintf(&b, "UPDATE %s SET install_id = LOWER(REPLACE(UUID(), '-', '')), created_at = UTC_TIMESTAMP(6);\n",
				ident(dst, t))
		}
	}
	if b.Len() > 0 {
		if _, err := db.ExecContext(ctx, b.String()); err != nil {
			return err
		}
	}
	if len(p.triggers) > 0 {
		if err := p.cloneTriggers(ctx, db, dst); err != nil {
			return err
		}
	}
	return p.cloneViews(ctx, db, dst)
}

func (p *plan) cloneTriggers(ctx context.Context, db *sql.DB, dst string) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	var mode string
	if err := conn.QueryRowContext(ctx, "SELECT @@SESSION.sql_mode").Scan(&mode); err != nil {
		return err
	}
	defer func() { _, _ = conn.ExecContext(context.Background(), "SET SESSION sql_mode = ?", mode) }()
	for _, t := range p.triggers {
		if _, err := conn.ExecContext(ctx, "SET SESSION sql_mode = ?", t.sqlMode); err != nil {
			return fmt.Errorf("trigger %s: sql_mode: %w", t.name, err)
		}
		stmt := fmt.Sprintf("CREATE TRIGGER %s %s %s ON %s FOR EACH %s %s", ident(dst, t.name), t.timing, t.event,
			ident(dst, t.table), t.orientation, p.retarget(t.statement, dst))
		if _, err := conn.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("trigger %s: %w", t.name, err)
		}
	}
	return nil
}

// cloneViews creates the views, in passes so that a view over another view follows it.
func (p *plan) cloneViews(ctx context.Context, db *sql.DB, dst string) error {
	todo := p.views
	for len(todo) > 0 {
		var later []view
		var lastErr error
		for _, v := range todo {
			stmt := fmt.Sprintf("CREATE VIEW %s AS %s", ident(dst, v.name), p.retarget(v.definition, dst))
			if v.checkOption != "" && v.checkOption != "NONE" {
				stmt += " WITH " + v.checkOption + " CHECK OPTION"
			}
			if _, err := db.ExecContext(ctx, stmt); err != nil {
				var me *mysql.MySQLError
				if errors.As(err, &me) && me.Number == 1146 { // a view it reads is not there yet
					later, lastErr = append(later, v), fmt.Errorf("view %s: %w", v.name, err)
					continue
				}
				return fmt.Errorf("view %s: %w", v.name, err)
			}
		}
		if len(later) == len(todo) {
			return lastErr
		}
		todo = later
	}
	return nil
}

// retarget points the source's qualified names (`src`.`t`, as view definitions have them) at
// dst.
func (p *plan) retarget(sqlText, dst string) string {
	return strings.ReplaceAll(sqlText, ident(p.src)+".", ident(dst)+".")
}

// ident quotes and joins the parts of a name: ident("db", "t") is `db`.`t`.
func ident(parts ...string) string {
	q := make([]string, len(parts))
	for i, s := range parts {
		q[i] = "`" + strings.ReplaceAll(s, "`", "``") + "`"
	}
	return strings.Join(q, ".")
}

func identList(cols []string) string {
	q := make([]string, len(cols))
	for i, c := range cols {
		q[i] = ident(c)
	}
	return strings.Join(q, ", ")
}

func queryRows(ctx context.Context, db *sql.DB, query string, args []any, each func(*sql.Rows) error) error {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}
