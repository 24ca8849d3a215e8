-- The session batch every SQL Server connection sends after login (src/db/mssql/session.rs); no parameters
SET LANGUAGE us_english; SET DATEFORMAT ymd; SET DATEFIRST 7; SET TEXTSIZE 2147483647; SET ANSI_WARNINGS ON; SET NUMERIC_ROUNDABORT OFF;
