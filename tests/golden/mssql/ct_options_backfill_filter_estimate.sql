-- @P1 = Filter(0), @P2 = Filter(1), @P3 = Filter(2)
SELECT COUNT_BIG(*) AS ESTIMATE FROM [Sales Ünïcode].[Order]] Lines] AS T WHERE (T.[Qty] > CONVERT(INT, @P1) OR T.[Line №] IN (CONVERT(NVARCHAR(MAX), @P2), CONVERT(NVARCHAR(MAX), @P3)))
