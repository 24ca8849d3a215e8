-- no parameters
SELECT COUNT_BIG(*) AS ESTIMATE FROM [Sales Ünïcode].[Order]] Lines] AS T
